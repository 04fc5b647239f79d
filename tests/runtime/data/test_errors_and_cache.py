"""Bad input (one clear DataError each) and the node cache: built once per node by concurrent
processes, never trusted half-written, no temporary files left behind."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

import numpy as np
import pytest
import torch

from runtime.data import cache as cache_module
from runtime.data.dataset import Batches, DataError, open_dataset
from runtime.data.tokenizer import ByteTokenizer

from .conftest import assert_token_batches, corpus, make_config, tail_split


def open_source(source: str, **kw):
    config = make_config(source, **kw)
    return open_dataset(config.data, config.model)


# -- bad input -------------------------------------------------------------------------------------


def test_missing_path_and_empty_folder_and_empty_glob(tmp_path):
    with pytest.raises(DataError, match=r"nowhere does not exist on this node; expected a file, a folder or a glob"):
        open_source(f"text:{tmp_path / 'nowhere'}")
    (tmp_path / "empty" / ".hidden").mkdir(parents=True)
    with pytest.raises(DataError, match=r"the folder .*empty holds no regular non-hidden files"):
        open_source(f"jsonl:{tmp_path / 'empty'}")
    with pytest.raises(DataError, match=r"the glob .*\*.txt' matches no file on this node"):
        open_source(f"text:{tmp_path}/*.txt")
    with pytest.raises(DataError, match=r"token file .*missing.bin does not exist on this node"):
        open_source(f"tokens:{tmp_path / 'missing.bin'}")


def test_non_utf8_text_names_the_file_and_byte_offset(tmp_path):
    (tmp_path / "a.txt").write_text("fine\n" * 10)
    (tmp_path / "b.bin").write_bytes(b"line one\nline two \xff\xfe and more")
    with pytest.raises(DataError, match=r"b.bin is not UTF-8 text: byte offset 18 \(b'\\xff'"):
        open_source(f"text:{tmp_path}")


def test_jsonl_bad_line_and_missing_field(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n\n{"text": broken\n')
    with pytest.raises(DataError, match=r"a.jsonl:3 is not JSON .*expected a JSON object with a string field 'text'"):
        open_source(f"jsonl:{tmp_path / 'a.jsonl'}")
    (tmp_path / "b.jsonl").write_text('{"body": "ok"}\n{"title": "no body"}\n')
    with pytest.raises(DataError, match=r"b.jsonl:2 has no field 'body' \(got an object without it\)"):
        open_source(f"jsonl:{tmp_path / 'b.jsonl'}?field=body")
    (tmp_path / "c.jsonl").write_text('{"text": 5}\n')
    with pytest.raises(DataError, match=r"c.jsonl:1: field 'text' is a int, expected a string"):
        open_source(f"jsonl:{tmp_path / 'c.jsonl'}")


def test_token_file_size_and_vocabulary(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError, match=r"odd.bin has 3 bytes, not a positive multiple of 2 \(uint16 tokens\)"):
        open_source(f"tokens:{tmp_path / 'odd.bin'}")
    tokens = np.full(500, 7, dtype=np.uint16)
    tokens[3] = 300
    tokens.tofile(tmp_path / "big.bin")
    with pytest.raises(DataError, match=r"holds token id 300, beyond the model's vocabulary \(model.vocab_size=256\)"):
        open_source(f"tokens:{tmp_path / 'big.bin'}")


def test_hf_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a" * 50] * 4}), tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"x.parquet has no column 'text' \(columns: \['body'\]\); set it with"):
        open_source(f"hf:{tmp_path / 'x.parquet'}")
    (tmp_path / "dd" / "train").mkdir(parents=True)
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(DataError, match=r"has no split 'dev' \(splits: \['train'\]\)"):
        open_source(f"hf:{tmp_path / 'dd'}?split=dev")


def test_missing_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(DataError, match=r"pip install 'spotpipe\[hf\]'"):
        open_source(f"hf:{tmp_path}")


def test_py_import_error_and_wrong_return_type(tmp_path, monkeypatch):
    (tmp_path / "h18_broken.py").write_text("import not_a_module_h18\n")
    (tmp_path / "h18_wrong.py").write_text("def number():\n    return 42\n\ndef items():\n    return [1, 2]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DataError, match=r"importing 'h18_broken' failed \(ModuleNotFoundError: No module named "
                                        r"'not_a_module_h18'\)"):
        open_source("py:h18_broken:build")
    with pytest.raises(DataError, match=r"py:h18_wrong:number returned int; expected a map-style dataset"):
        open_source("py:h18_wrong:number")
    with pytest.raises(DataError, match=r"item 0 is int; expected a map-style dataset: __len__ and __getitem__"):
        open_source("py:h18_wrong:items")
    with pytest.raises(DataError, match=r"module 'h18_wrong' has no function 'absent'"):
        open_source("py:h18_wrong:absent")


def test_too_little_text(tmp_path):
    (tmp_path / "a.txt").write_text("tiny")
    with pytest.raises(DataError, match=r"has 4 tokens: too few for a training and a validation split"):
        open_source(f"text:{tmp_path / 'a.txt'}")


# -- the node cache --------------------------------------------------------------------------------


def _entries(cache) -> list:
    return sorted(p.name for p in (cache / "tokens").iterdir() if p.is_dir())


def _leftovers(cache) -> list:
    return [p for p in cache.rglob("*") if ".part-" in p.name]


def test_the_cache_is_reused_and_keyed_by_content(tmp_path, cache):
    text = corpus(9, 1500)
    (tmp_path / "a.txt").write_text(text)
    config = make_config(f"text:{tmp_path / 'a.txt'}")
    first = Batches(config).dataset.description
    meta = json.loads((cache / "tokens" / first["content_hash"] / "meta.json").read_text())
    assert meta["tokens"] == {"all": len(text.encode())} and meta["max_id"] == max(text.encode())
    (tmp_path / "b.txt").write_text(text)  # the same content under another name: the same entry
    again = Batches(make_config(f"text:{tmp_path / 'b.txt'}")).dataset.description
    assert again["content_hash"] == first["content_hash"]
    # a different val_fraction reuses it too (the tail is held out when opened)
    assert Batches(make_config(f"text:{tmp_path / 'a.txt'}", val_fraction=0.3)).dataset.description["content_hash"] \
        == first["content_hash"]
    (tmp_path / "a.txt").write_text(text + "more")
    assert Batches(config).dataset.description["content_hash"] != first["content_hash"]
    assert len(_entries(cache)) == 2


def _open_in_process(source: str, cache: str, markers: str, barrier, queue) -> None:
    """A 'rank' on the node: records a marker file if it tokenizes, returns its micro-batches."""
    os.environ["SPOTPIPE_DATA_CACHE"] = cache
    real = cache_module._write_stream

    def counted(*args, **kwargs):
        open(os.path.join(markers, str(os.getpid())), "w").close()
        return real(*args, **kwargs)

    cache_module._write_stream = counted
    barrier.wait()
    batches = Batches(make_config(source))
    queue.put([t.tolist() for t in batches.train(step=2, index=1, size=2)] + [batches.dataset.description["cache"]])


def test_two_processes_tokenize_once_and_read_the_same_tokens(tmp_path, cache):
    text = corpus(11, 100_000)
    (tmp_path / "big.txt").write_text(text)
    (tmp_path / "markers").mkdir()
    context = mp.get_context("fork")  # fork: no second torch import (seconds)
    barrier, queue = context.Barrier(2), context.Queue()
    args = (f"text:{tmp_path / 'big.txt'}", str(cache), str(tmp_path / "markers"), barrier, queue)
    ranks = [context.Process(target=_open_in_process, args=args) for _ in range(2)]
    for rank in ranks:
        rank.start()
    results = [queue.get(timeout=60) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=30)
        assert rank.exitcode == 0
    assert results[0] == results[1]
    assert len(list((tmp_path / "markers").iterdir())) == 1  # one process tokenized, the other waited
    assert len(_entries(cache)) == 1 and not _leftovers(cache)
    config = make_config(f"text:{tmp_path / 'big.txt'}")
    assert_token_batches(config, *tail_split(list(text.encode()), config))


def test_a_failed_tokenization_leaves_nothing_and_the_next_open_rebuilds(tmp_path, cache, monkeypatch):
    texts = [corpus(i, 600) for i in range(3)]
    for i, text in enumerate(texts):
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / f"{i}.txt").write_text(text)
    calls = []
    real = ByteTokenizer.encode

    def failing(self, text):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("tokenizer crashed")
        return real(self, text)

    monkeypatch.setattr(ByteTokenizer, "encode", failing)
    config = make_config(f"text:{tmp_path / 'docs'}")
    with pytest.raises(RuntimeError, match="tokenizer crashed"):
        Batches(config)
    assert _entries(cache) == [] and not _leftovers(cache)
    monkeypatch.setattr(ByteTokenizer, "encode", real)
    assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))


def _killed_mid_way(source: str, cache: str) -> None:
    os.environ["SPOTPIPE_DATA_CACHE"] = cache
    real = ByteTokenizer.encode
    calls = []

    def dying(self, text):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, text)

    ByteTokenizer.encode = dying
    cache_module.FLUSH_TOKENS = 16  # so something is written before the kill
    Batches(make_config(source))


def test_a_killed_tokenizer_leaves_nothing_a_later_open_trusts(tmp_path, cache):
    texts = [corpus(20 + i, 700) for i in range(4)]
    (tmp_path / "docs").mkdir()
    for i, text in enumerate(texts):
        (tmp_path / "docs" / f"{i}.txt").write_text(text)
    source = f"text:{tmp_path / 'docs'}"
    process = mp.get_context("fork").Process(target=_killed_mid_way, args=(source, str(cache)))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == -signal.SIGKILL
    (entry,) = _entries(cache)
    assert _leftovers(cache) and not (cache / "tokens" / entry / "meta.json").exists()
    config = make_config(source)
    batches = assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))
    assert batches.dataset.description["content_hash"] == entry and not _leftovers(cache)
    torch.testing.assert_close(batches.train(step=0, index=0, size=1)[0],
                               Batches(config).train(step=0, index=0, size=1)[0])
