"""`mds:` MosaicML MDS shards of text, read by spotpipe's own reader of the format from fixtures the
library wrote and read back itself (tests/runtime/data/fixtures/make_mds.py: uncompressed, gz and
zstd shards, a unicode and an empty document): the same documents, in the library's order; the same
windows as those documents joined; the same stream prepared once and read through `shards:`, and
from S3 (moto); each bad input an error naming it."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from runtime.config import DataSpec, parse_source
from runtime.data.dataset import Batches, DataError, open_dataset
from runtime.data.formats import mds
from runtime.data.prepare import prepare

from .conftest import assert_token_batches, make_config, tail_split

FIXTURES = Path(__file__).parent / "fixtures" / "mds"


def _expected(kind: str) -> list[str]:
    return json.loads((FIXTURES / kind / "expected.json").read_text())["text"]


@pytest.mark.parametrize("kind", ["plain", "gz", "zstd"])
def test_the_documents_are_the_ones_the_library_reads_back(kind: str, tmp_path: Path) -> None:
    uri = parse_source(f"mds:{FIXTURES / kind}")
    shards = mds.stream_files(uri, tmp_path)["all"]
    assert len(shards) == 10 and all(p.exists() for p in shards)
    documents = [texts[0] for texts in mds.documents_of(uri, shards)]
    assert documents == _expected(kind) and "" in documents and any("七転び八起き" in d for d in documents)


def test_the_windows_are_the_documents_joined_and_prepare_reads_the_same(tmp_path: Path) -> None:
    config = make_config(f"mds:{FIXTURES / 'plain'}")
    tokens = list("\n\n".join(_expected("plain")).encode())
    assert_token_batches(config, *tail_split(tokens, config))

    out = tmp_path / "prepared"
    prepare(f"mds:{FIXTURES / 'zstd'}", tokenizer="byte", out=str(out), shard_bytes=512, page_bytes=128,
            workers=2, stream=io.StringIO())
    streamed, whole = Batches(make_config(f"shards:{out}")), Batches(config)
    for step in range(0, 40, 7):
        for got, want in zip(streamed.train(step=step, index=0, size=2), whole.train(step=step, index=0, size=2),
                             strict=True):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    streamed.close()


def test_an_mds_folder_on_s3_reads_as_the_local_one(s3, tmp_path: Path) -> None:
    client, bucket = s3
    for path in (FIXTURES / "gz").iterdir():
        client.upload_file(str(path), bucket, f"corpus/mds/{path.name}")
    remote, local = (Batches(make_config(source)) for source in (f"mds:s3://{bucket}/corpus/mds/",
                                                                   f"mds:{FIXTURES / 'gz'}"))
    assert remote.dataset.description["content_hash"] == local.dataset.description["content_hash"]
    for got, want in zip(remote.train(step=3, index=1, size=2), local.train(step=3, index=1, size=2), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    out = tmp_path / "prepared"  # prepare mirrors it (a shard is read with its index), then reads the same
    prepare(f"mds:s3://{bucket}/corpus/mds/", tokenizer="byte", out=str(out), shard_bytes=512, page_bytes=128,
            stream=io.StringIO())
    streamed = Batches(make_config(f"shards:{out}"))
    for got, want in zip(streamed.train(step=3, index=1, size=2), local.train(step=3, index=1, size=2), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    streamed.close()


def _broken(tmp_path: Path, change) -> Path:
    folder = tmp_path / "mds"
    shutil.copytree(FIXTURES / "plain", folder)
    change(folder)
    return folder


def _edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(("change", "option", "message"), [
    (lambda f: (f / "index.json").unlink(), "", r"no index\.json; expected an MDS folder"),
    (lambda f: (f / "index.json").write_text("{"), "", r"index\.json is not JSON"),
    (lambda f: _edit_index(f, lambda i: i["shards"][0].update(version=1)), "",
     r"shard 0 is \{'format': 'mds', 'version': 1\}; expected format 'mds', version 2"),
    (lambda f: _edit_index(f, lambda i: i["shards"][3].update(compression="br")), "",
     r"shard 3 is compressed with 'br'; expected none or one of \['bz2', 'gz', 'zstd'\]"),
    (lambda f: None, "?field=body", r"no column 'body' \(its columns: \['id', 'source', 'text'\]\)"),
    (lambda f: None, "?field=id", r"column 'id' is encoded 'int'; expected text \('str'\)"),
    (lambda f: (f / "shard.00004.mds").unlink(), "", r"shard shard\.00004\.mds is listed in index\.json but missing"),
    (lambda f: (f / "shard.00002.mds").write_bytes((f / "shard.00002.mds").read_bytes()[:-9]), "",
     r"shard\.00002\.mds: \d+ bytes, expected \d+ holding \d samples"),
])
def test_each_bad_input_is_an_error_naming_it(tmp_path: Path, change, option: str, message: str) -> None:
    folder = _broken(tmp_path, change)
    with pytest.raises(DataError, match=message):
        open_dataset(DataSpec(source=f"mds:{folder}{option}"), make_config("text:x").model, cache_dir=tmp_path / "c")
