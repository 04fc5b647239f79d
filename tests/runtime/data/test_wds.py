"""`wds:` WebDataset tar shards of text: samples in tar order, tars in file order, the same windows
as the documents joined; a corpus of tars prepared once reads the same through `shards:`; a sample
without its text member or a file that is not a tar is an error naming it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from runtime.config import DataSpec
from runtime.data.dataset import Batches, DataError, open_dataset
from runtime.data.prepare import prepare

from .conftest import assert_token_batches, corpus, make_config, tail_split


def write_tar(path: Path, samples: list[dict[str, bytes]], mode: str = "w") -> None:
    """A WebDataset shard: each sample's members `KEY.EXT`, consecutive (as webdataset's TarWriter writes)."""
    with tarfile.open(path, mode) as archive:
        for sample in samples:
            for name, data in sample.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


def test_samples_in_tar_order_tars_in_file_order(tmp_path):
    texts = [corpus(90 + i, 300) for i in range(7)]
    folder = tmp_path / "shards"
    folder.mkdir()
    samples = [{f"part/{i:04d}.txt": t.encode(), f"part/{i:04d}.json": b'{"id": %d}' % i} for i, t in enumerate(texts)]
    write_tar(folder / "shard-000000.tar", samples[:3])
    write_tar(folder / "shard-000001.tar.gz", samples[3:], mode="w:gz")
    (folder / "README.md").write_text("not a shard")  # a folder means its tars only
    config = make_config(f"wds:{folder}")
    assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))

    out = tmp_path / "prepared"
    prepare(f"wds:{folder}", tokenizer="byte", out=str(out), shard_bytes=1024, page_bytes=128, stream=io.StringIO())
    streamed, whole = Batches(make_config(f"shards:{out}")), Batches(config)
    assert streamed.dataset.description["content_hash"] == whole.dataset.description["content_hash"]
    for step in range(0, 60, 7):
        for got, want in zip(streamed.train(step=step, index=1, size=2), whole.train(step=step, index=1, size=2),
                             strict=True):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    streamed.close()


def test_another_extension_and_the_errors(tmp_path):
    model = make_config("text:x").model
    write_tar(tmp_path / "a.tar", [{"0.md": corpus(1, 400).encode()}, {"1.md": corpus(2, 400).encode()}])
    assert len(open_dataset(DataSpec(source=f"wds:{tmp_path / 'a.tar'}?field=md"), model).train) > 10
    with pytest.raises(DataError, match=r"a\.tar: sample '0' has no 'txt' member \(it has \['0\.md'\]\)"):
        open_dataset(DataSpec(source=f"wds:{tmp_path / 'a.tar'}"), model)
    (tmp_path / "b.tar").write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(DataError, match=r"b\.tar is not a tar file"):
        open_dataset(DataSpec(source=f"wds:{tmp_path / 'b.tar'}"), model)
    write_tar(tmp_path / "c.tar", [{"0.txt": b"\xff\xfe not utf-8"}])
    with pytest.raises(DataError, match=r"c\.tar: 0\.txt is not UTF-8 text"):
        open_dataset(DataSpec(source=f"wds:{tmp_path / 'c.tar'}"), model)
