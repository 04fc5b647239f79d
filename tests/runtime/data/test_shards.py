"""Prepared corpora (`spotpipe data prepare`) and the `shards:` source: the same samples as the source
read whole, in a local folder and on S3 (moto), through a bounded page cache; a killed prepare
resumed; every bad input a clear error naming the location."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.config import DataSpec
from runtime.data.dataset import Batches, DataError, open_dataset
from runtime.data.location import open_location
from runtime.data.pagecache import PageCache
from runtime.data.prepare import prepare
from runtime.data.prepared import read_index, unpack_pages

from .conftest import assert_token_batches, corpus, make_config, tail_split

SMALL = {"shard_bytes": 1024, "page_bytes": 128}
"""Shards of 512 tokens, pages of 64: windows straddle pages and shards."""


def write_corpus(folder: Path, count: int = 6, seed: int = 0, size: int = 900) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = [corpus(seed + i, size + 300 * i) for i in range(count)]
    for i, text in enumerate(texts):
        (folder / f"doc{i:02d}.txt").write_text(text)
    return texts


def stream_tokens(location: str, name: str = "all") -> np.ndarray:
    """A prepared stream's tokens, read back from its shard objects (skips applied)."""
    where = open_location(location)
    index = read_index(where)
    parts = [np.frombuffer(unpack_pages(where.read(s.name), index.page_bytes), dtype=index.dtype)[s.skip :]
             for s in index.streams[name]]
    return np.concatenate(parts)


def test_shards_read_the_samples_of_the_text_source(tmp_path):
    texts = write_corpus(tmp_path / "corpus")
    source = f"text:{tmp_path / 'corpus'}"
    summary = prepare(source, tokenizer="byte", out=str(tmp_path / "prepared"), workers=1, **SMALL,
                      stream=io.StringIO())
    assert len(summary.index.streams["all"]) > 10, "the corpus should span many shards"
    config = make_config(f"shards:{tmp_path / 'prepared'}")
    batches = assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))
    whole = Batches(make_config(source))
    assert batches.dataset.description["content_hash"] == whole.dataset.description["content_hash"]
    assert batches.dataset.description["train_tokens"] == whole.dataset.description["train_tokens"]


def test_the_token_stream_is_the_same_whatever_the_workers(tmp_path):
    write_corpus(tmp_path / "corpus", count=7)
    source = f"text:{tmp_path / 'corpus'}"
    quiet = io.StringIO()
    one = prepare(source, tokenizer="byte", out=str(tmp_path / "one"), workers=1, **SMALL, stream=quiet)
    three = prepare(source, tokenizer="byte", out=str(tmp_path / "three"), workers=3, **SMALL, stream=quiet)
    assert one.index.content_hash == three.index.content_hash
    np.testing.assert_array_equal(stream_tokens(str(tmp_path / "one")), stream_tokens(str(tmp_path / "three")))
    cached = Batches(make_config(source)).dataset.train.tokens  # the node cache's tokenization of the same source
    np.testing.assert_array_equal(stream_tokens(str(tmp_path / "one"))[: len(cached)], np.asarray(cached))


def test_jsonl_with_empty_files_and_hf_with_a_validation_split(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "j"
    folder.mkdir()
    bodies = [corpus(40 + i, 150) for i in range(9)]
    (folder / "a.jsonl").write_text("")  # no documents: no separator either
    (folder / "b.jsonl").write_text("\n".join(json.dumps({"text": b}) for b in bodies[:4]))
    (folder / "c.jsonl").write_text("\n".join(json.dumps({"text": b}) for b in bodies[4:]))
    quiet = io.StringIO()
    prepare(f"jsonl:{folder}", tokenizer="byte", out=str(tmp_path / "pj"), workers=2, **SMALL, stream=quiet)
    config = make_config(f"shards:{tmp_path / 'pj'}")
    assert_token_batches(config, *tail_split(list("\n\n".join(bodies).encode()), config))

    hf = tmp_path / "hf"
    hf.mkdir()
    train, val = [corpus(60 + i, 300) for i in range(5)], [corpus(80 + i, 200) for i in range(2)]
    pq.write_table(pa.table({"text": train}), hf / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": val}), hf / "validation-00000-of-00001.parquet")
    prepare(f"hf:{hf}", tokenizer="byte", out=str(tmp_path / "ph"), workers=1, **SMALL, stream=quiet)
    assert set(read_index(open_location(str(tmp_path / "ph"))).streams) == {"train", "val"}
    assert_token_batches(make_config(f"shards:{tmp_path / 'ph'}"), list("\n\n".join(train).encode()),
                         list("\n\n".join(val).encode()))


def test_on_s3_with_a_cache_smaller_than_the_corpus(s3, tmp_path, cache):
    client, bucket = s3
    texts = write_corpus(tmp_path / "corpus", count=12, size=4000)
    out = f"s3://{bucket}/prepared/"
    prepare(f"text:{tmp_path / 'corpus'}", tokenizer="byte", out=out, workers=2, shard_bytes=4096, page_bytes=1024,
            stream=io.StringIO())
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="prepared/")["Contents"]]
    assert "prepared/index.json" in keys and sum(k.endswith(".bin") for k in keys) > 10
    corpus_bytes = read_index(open_location(out)).total_bytes
    limit = 1 << 16
    assert corpus_bytes > limit, "the test needs a corpus larger than the cache"
    config = make_config(f"shards:{out}")
    config.data.cache_bytes = limit
    assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))
    batches = Batches(config)
    for step in range(200):  # every window of two epochs: many more pages than fit
        batches.train(step=step, index=0, size=4)
    totals = PageCache(cache / "pages", limit).totals()
    assert totals["peak"] <= limit and totals["held"] <= limit
    assert totals["fetched"] > limit, "nothing was evicted: the cache was never full"
    on_disk = sum(p.stat().st_size for p in (cache / "pages").rglob("*") if p.is_file() and p.parent.name != "pages"
                  and p.parent.name != "locks")
    assert on_disk <= limit


def test_a_killed_prepare_resumes_where_it_stopped(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):  # enough files that the kill lands before the end
        (folder / f"f{i:03d}.txt").write_bytes(bytes(rng.integers(97, 123, 200_000, dtype=np.uint8)))
    out = tmp_path / "prepared"
    command = [sys.executable, "-m", "spotpipe.cli", "data", "prepare", f"text:{folder}", "--out", str(out),
               "--shard-bytes", "65536", "--page-bytes", "4096"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while len(list((out / "units").glob("all-*.json"))) < 3:
        assert first.poll() is None, "prepare ended before it could be killed"
        assert time.monotonic() < deadline, "no unit finished"
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not (out / "index.json").exists()
    with pytest.raises(DataError, match="did not finish: run the same `spotpipe data prepare` again"):
        open_dataset(DataSpec(source=f"shards:{out}"), make_config("text:x").model)
    done = len(list((out / "units").glob("all-*.json")))
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"({done} done before)" in second.stdout or f"({done + 1} done before)" in second.stdout
    fresh = tmp_path / "fresh"
    prepare(f"text:{folder}", tokenizer="byte", out=str(fresh), shard_bytes=65536, page_bytes=4096,
            stream=io.StringIO())
    np.testing.assert_array_equal(stream_tokens(str(out)), stream_tokens(str(fresh)))


@pytest.fixture
def prepared(tmp_path) -> Path:
    write_corpus(tmp_path / "corpus")
    out = tmp_path / "prepared"
    prepare(f"text:{tmp_path / 'corpus'}", tokenizer="byte", out=str(out), **SMALL, stream=io.StringIO())
    return out


def test_a_changed_or_missing_shard_is_an_error_naming_it(prepared):
    index = read_index(open_location(str(prepared)))
    shard = prepared / index.streams["all"][3].name
    data = bytearray(shard.read_bytes())
    data[5] ^= 1
    shard.write_bytes(bytes(data))
    train = Batches(make_config(f"shards:{prepared}")).dataset.train
    every = np.arange(len(train))
    with pytest.raises(DataError, match=f"{shard.name}: page 0 .* does not match its digest"):
        train.take(every)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(DataError, match=f"{shard.name} has {len(data) - 2} bytes; the index expects {len(data)}"):
        train.take(every)
    shard.unlink()
    with pytest.raises(DataError, match=f"{shard.name} is missing"):
        train.take(every)


def test_bad_locations_tokenizers_and_vocabularies(prepared, tmp_path, s3):
    model = make_config("text:x").model
    with pytest.raises(DataError, match=r"index\.json does not exist: not a prepared corpus; prepare the corpus"):
        open_dataset(DataSpec(source=f"shards:{tmp_path}"), model)
    (tmp_path / "index.json").write_text('{"format": "other"}')
    with pytest.raises(DataError, match="is not a spotpipe shard index"):
        open_dataset(DataSpec(source=f"shards:{tmp_path}"), model)
    tokenizer = tmp_path / "tokenizer.json"
    _word_tokenizer(tokenizer)
    with pytest.raises(DataError, match=r"was prepared with tokenizer 'byte' .* expected the same tokenizer"):
        open_dataset(DataSpec(source=f"shards:{prepared}", tokenizer=str(tokenizer)), model)
    small = make_config("text:x", vocab=200).model
    with pytest.raises(DataError, match=r"model.vocab_size=200"):
        open_dataset(DataSpec(source=f"shards:{prepared}"), small)
    with pytest.raises(DataError, match="bucket 'no-such-bucket-here' does not exist"):
        open_dataset(DataSpec(source="shards:s3://no-such-bucket-here/corpus/"), model)
    with pytest.raises(DataError, match="only text, jsonl, hf, wds, mds sources are prepared"):
        prepare(f"tokens:{tmp_path}", tokenizer="byte", out=str(tmp_path / "x"))
    with pytest.raises(DataError, match="already holds a prepared corpus"):
        prepare(f"text:{tmp_path / 'corpus'}", tokenizer="byte", out=str(prepared))


def _word_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def test_an_unreachable_store_is_an_error_without_the_signed_url(monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in (("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}"), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(DataError, match=r"s3://corpus-bucket/prepared/index\.json: cannot reach S3") as caught:
        open_dataset(DataSpec(source="shards:s3://corpus-bucket/prepared/"), make_config("text:x").model)
    assert "X-Amz-Signature" not in str(caught.value) and "X-Amz-Credential" not in str(caught.value)


def test_an_s3_source_is_prepared_object_by_object_not_mirrored(s3, tmp_path, cache):
    client, bucket = s3
    texts = [corpus(30 + i, 1500) for i in range(4)]
    for key, text in zip(("raw/a.txt", "raw/b/c.txt", "raw/d.txt", "raw/e.md"), texts, strict=True):
        client.put_object(Bucket=bucket, Key=key, Body=text.encode())
    client.put_object(Bucket=bucket, Key="raw/.hidden/x.txt", Body=b"hidden: not part of the corpus")
    client.put_object(Bucket=bucket, Key="raw-other/y.txt", Body=b"another prefix")
    out = tmp_path / "prepared"
    summary = prepare(f"text:s3://{bucket}/raw/", tokenizer="byte", out=str(out), workers=2, **SMALL,
                      stream=io.StringIO())
    assert summary.files == 4 and not (cache / "s3").exists(), "the preparing machine mirrored the corpus"
    whole = Batches(make_config(f"text:s3://{bucket}/raw/"))  # the node's own reader: mirror + tokenize
    assert summary.index.content_hash == whole.dataset.description["content_hash"]
    np.testing.assert_array_equal(stream_tokens(str(out))[: len(whole.dataset.train.tokens)],
                                  np.asarray(whole.dataset.train.tokens))


def test_machines_each_prepare_a_share_and_the_last_writes_the_index(s3, tmp_path, cache):
    """Three machines (processes) prepare an S3 corpus into S3 together, one share each, at once: each
    tokenizes only its share of the files, cut alike on every machine and balanced by bytes; the
    share that ends last writes the index, which equals one machine's prepare of the whole corpus."""
    client, bucket = s3
    for i in range(9):
        client.put_object(Bucket=bucket, Key=f"raw/f{i}.txt", Body=corpus(60 + i, 1000 + 700 * (i % 4)).encode())
    out = f"s3://{bucket}/shared/"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    shares = [subprocess.Popen([sys.executable, "-m", "spotpipe.cli", "data", "prepare", f"text:s3://{bucket}/raw/",
                                "--out", out, "--shard-bytes", "1024", "--page-bytes", "128", "--share", f"{k}/3"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for k in range(3)]
    outputs = [p.communicate(timeout=240)[0] for p in shares]
    assert [p.returncode for p in shares] == [0, 0, 0], outputs
    files = [int(line.split("/")[1].split(" ")[0]) for text in outputs for line in text.splitlines()
             if line.startswith("prepare: ") and line.split()[1].split("/")[0] == line.split()[1].split("/")[1]]
    assert sorted(files) == [3, 3, 3], outputs  # each machine did its own share: a third of the files
    assert sum("prepared s3://" in text for text in outputs) >= 1  # the last share wrote the index
    whole = tmp_path / "whole"
    alone = prepare(f"text:s3://{bucket}/raw/", tokenizer="byte", out=str(whole), shard_bytes=1024, page_bytes=128,
                    stream=io.StringIO())
    assert read_index(open_location(out)).content_hash == alone.index.content_hash
    np.testing.assert_array_equal(stream_tokens(out), stream_tokens(str(whole)))


def test_shares_are_cut_alike_everywhere_and_balanced_by_bytes():
    from runtime.data.prepare import Unit, parse_share, share_units

    units = [Unit("all", i, f"f{i}", size) for i, size in enumerate([900, 100, 500, 500, 300, 700, 200])]
    cut = [share_units(units, (k, 3)) for k in range(3)]
    assert sorted(u.number for part in cut for u in part) == list(range(7))  # every unit once
    loads = [sum(u.size for u in part) for part in cut]
    assert max(loads) - min(loads) <= max(u.size for u in units)
    assert cut == [share_units(list(reversed(units)), (k, 3)) for k in range(3)]  # whatever the listing order
    assert parse_share("2/3") == (2, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(DataError, match="--share"):
            parse_share(bad)
