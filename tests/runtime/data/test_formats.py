"""Every format: the exact tokens of given (seed, step, micro-batch) triples and of validation
micro-batches, computed here independently (bytes of the test's text, the sampler's documented rule)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from runtime.data.dataset import Batches
from runtime.data.formats.text import read_text

from .conftest import (
    TRIPLES,
    as_pair,
    assert_token_batches,
    corpus,
    expected_train_rows,
    expected_val_rows,
    make_config,
    tail_split,
)


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# -- tokens: ---------------------------------------------------------------------------------------


def test_tokens_folder(tmp_path):
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 256, 900), rng.integers(0, 256, 120)
    train.astype(np.uint16).tofile(tmp_path / "train.bin")
    val.astype(np.uint16).tofile(tmp_path / "val.bin")
    assert_token_batches(make_config(f"tokens:{tmp_path}"), train.tolist(), val.tolist())


def test_tokens_single_file_holds_out_the_tail(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 256, 1000)
    tokens.astype(np.uint16).tofile(tmp_path / "all.bin")
    config = make_config(f"tokens:{tmp_path / 'all.bin'}")
    assert_token_batches(config, *tail_split(tokens.tolist(), config))


def test_tokens_uint32(tmp_path):
    tokens = np.random.default_rng(2).integers(0, 70_000, 800)
    tokens.astype(np.uint32).tofile(tmp_path / "big.bin")
    config = make_config(f"tokens:{tmp_path / 'big.bin'}?dtype=uint32", vocab=70_000)
    assert_token_batches(config, *tail_split(tokens.tolist(), config))


# -- text: -----------------------------------------------------------------------------------------


def test_text_file(tmp_path):
    text = corpus(0, 3000)
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    config = make_config(f"text:{tmp_path / 'book.txt'}")
    batches = assert_token_batches(config, *tail_split(byte_ids(text), config))
    assert batches.dataset.description["content_hash"]
    assert batches.dataset.description["tokens_dtype"] == "uint16"


def _three_files(root) -> list[str]:
    """a.txt, c.txt, sub/b.md (sorted by relative path), and hidden files that are skipped."""
    texts = [corpus(1, 700), corpus(2, 900), corpus(3, 500)]
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.txt").write_text(texts[0])
    (root / "c.txt").write_text(texts[1])
    (root / "sub" / "b.md").write_text(texts[2])
    (root / ".git" / "HEAD").write_bytes(b"\xff\xfe binary")
    (root / ".hidden.txt").write_text("not read")
    return texts


def test_text_folder_reads_all_non_hidden_files_sorted_joined_by_blank_line(tmp_path):
    texts = _three_files(tmp_path / "corpus")
    config = make_config(f"text:{tmp_path / 'corpus'}")
    batches = assert_token_batches(config, *tail_split(byte_ids("\n\n".join(texts)), config))
    assert batches.dataset.description["files"] == {"all": 3}


def test_text_glob(tmp_path):
    texts = _three_files(tmp_path / "corpus")
    config = make_config(f"text:{tmp_path}/corpus/**/*.txt")
    assert_token_batches(config, *tail_split(byte_ids("\n\n".join([texts[0], texts[1]])), config))


def test_text_is_read_in_chunks_that_rejoin_exactly(tmp_path):
    text = corpus(4, 400) + "x" * 50 + "日本" * 20  # long runs without newline, multi-byte at the cuts
    (tmp_path / "t.txt").write_text(text)
    for size in (1, 2, 3, 5, 7, 64):
        for carry in (size * 2, 1 << 20):  # forced cuts at character boundaries, and only at line starts
            pieces = list(read_text(tmp_path / "t.txt", chunk_bytes=size, max_carry=carry))
            assert "".join(pieces) == text
    pieces = list(read_text(tmp_path / "t.txt", chunk_bytes=16))
    assert len(pieces) > 1 and all(p.endswith("\n") for p in pieces[:-1])
    assert all(not p[0].isspace() for p in pieces[1:])  # a word tokenizer sees the same words


# -- jsonl: ----------------------------------------------------------------------------------------


def test_jsonl_field_over_files(tmp_path):
    bodies = [corpus(10 + i, 150 + 37 * i) for i in range(8)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": b, "id": i}) for i, b in enumerate(bodies[:5])))
    (tmp_path / "b.jsonl").write_text("\n\n".join(json.dumps({"body": b}) for b in bodies[5:]) + "\n")
    config = make_config(f"jsonl:{tmp_path}/*.jsonl?field=body")
    assert_token_batches(config, *tail_split(byte_ids("\n\n".join(bodies)), config))


# -- hf: -------------------------------------------------------------------------------------------


def write_arrow_dataset(folder, rows: list[str], column: str = "text") -> None:
    """What datasets' Dataset.save_to_disk writes: Arrow IPC stream files, state.json, dataset_info.json."""
    import pyarrow as pa

    folder.mkdir(parents=True)
    halves = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    names = [f"data-0000{i}-of-00002.arrow" for i in range(2)]
    for name, part in zip(names, halves, strict=True):
        table = pa.table({column: part, "n": list(range(len(part)))})
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=3)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {column: {"dtype": "string"}}}))


def test_hf_arrow_folder_without_splits_holds_out_the_tail(tmp_path):
    rows = [corpus(20 + i, 120) for i in range(12)]
    write_arrow_dataset(tmp_path / "ds", rows, column="content")
    config = make_config(f"hf:{tmp_path / 'ds'}?column=content")
    assert_token_batches(config, *tail_split(byte_ids("\n\n".join(rows)), config))


def test_hf_dataset_dict_uses_its_validation_split(tmp_path):
    train = [corpus(30 + i, 150) for i in range(10)]
    val = [corpus(50 + i, 60) for i in range(4)]
    write_arrow_dataset(tmp_path / "dd" / "train", train)
    write_arrow_dataset(tmp_path / "dd" / "validation", val)
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    config = make_config(f"hf:{tmp_path / 'dd'}")
    batches = assert_token_batches(config, byte_ids("\n\n".join(train)), byte_ids("\n\n".join(val)))
    assert batches.dataset.description["files"] == {"train": 2, "val": 2}


def test_parquet_file_and_hub_folder(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [corpus(60 + i, 100) for i in range(12)]
    pq.write_table(pa.table({"text": rows}), tmp_path / "one.parquet", row_group_size=5)
    config = make_config(f"hf:{tmp_path / 'one.parquet'}")
    assert_token_batches(config, *tail_split(byte_ids("\n\n".join(rows)), config))

    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": rows[:9]}), tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": rows[9:]}), tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    config = make_config(f"hf:{tmp_path / 'hub'}")
    assert_token_batches(config, byte_ids("\n\n".join(rows[:9])), byte_ids("\n\n".join(rows[9:])))


# -- py: -------------------------------------------------------------------------------------------

PY_MODULE = '''
import torch

def item(i):
    x = torch.arange(i, i + 4) % 7
    return x, (x + 1) % 7

def build():
    return [item(i) for i in range(30)]

def build_split(split):
    return [item(i) for i in (range(20) if split == "train" else range(100, 106))]

def not_a_dataset():
    return 42

def bad_items():
    return [1, 2, 3]
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "userdata_h18.py").write_text(PY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userdata_h18"
    import sys

    sys.modules.pop("userdata_h18", None)


def _item(i):
    x = torch.arange(i, i + 4) % 7
    return x, (x + 1) % 7


def _assert_items(config, train_items, val_items):
    for batches in (Batches(config), Batches(config)):
        assert (len(batches.dataset.train), len(batches.dataset.val)) == (len(train_items), len(val_items))
        for step, index, size in TRIPLES:
            items = expected_train_rows(train_items, config, step, index, size)
            got = batches.train(step=step, index=index, size=size)
            torch.testing.assert_close(got[0], torch.stack([x for x, _ in items]), rtol=0, atol=0)
            torch.testing.assert_close(got[1], torch.stack([y for _, y in items]), rtol=0, atol=0)
        items = expected_val_rows(val_items, config, 1, 1, 2)
        got = batches.val(batch=1, index=1, size=2)
        torch.testing.assert_close(got[0], torch.stack([x for x, _ in items]), rtol=0, atol=0)


def test_py_without_split_holds_out_the_tail_items(user_module):
    config = make_config(f"py:{user_module}:build", val_fraction=0.2)
    items = [_item(i) for i in range(30)]
    _assert_items(config, items[:24], items[24:])


def test_py_with_split_keyword(user_module):
    config = make_config(f"py:{user_module}:build_split")
    _assert_items(config, [_item(i) for i in range(20)], [_item(i) for i in range(100, 106)])


def test_as_pair_matches_windows():  # the helper the other tests trust
    inputs, targets = as_pair([np.arange(9), np.arange(9) + 1])
    assert inputs.tolist()[0] == list(range(8)) and targets.tolist()[0] == list(range(1, 9))
