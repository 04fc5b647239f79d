"""Fixtures of the data tests: a private node cache, small GPT configs, the expected tokens of a
micro-batch computed independently of runtime.data (the documented rule), and S3 on moto."""

from __future__ import annotations

import socket
import uuid

import numpy as np
import pytest
import torch

from runtime.config import DataSpec, JobConfig, ModelSpec
from runtime.data.dataset import Batches
from runtime.data.sampler import permuted

SEQ_LEN = 8
TRIPLES = [(0, 0, 2), (0, 1, 2), (3, 1, 2), (7, 0, 4), (250, 1, 2)]
"""(step, micro-batch, size) checked for every format; step 250 is past the first epoch of every test corpus."""


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test its own node cache ($SPOTPIPE_DATA_CACHE)."""
    root = tmp_path / "node-cache"
    monkeypatch.setenv("SPOTPIPE_DATA_CACHE", str(root))
    return root


def make_config(source: str, *, tokenizer: str = "byte", vocab: int = 256, seed: int = 3,
                val_fraction: float = 0.1, seq_len: int = SEQ_LEN) -> JobConfig:
    model = ModelSpec(kind="gpt", n_layer=1, n_embd=8, n_head=2, seq_len=seq_len, vocab_size=vocab)
    return JobConfig(model=model, dp=1, pp=1, microbatches=2, global_batch=4, seed=seed,
                     data=DataSpec(source=source, tokenizer=tokenizer, val_fraction=val_fraction))


def windows(tokens: list[int] | np.ndarray, seq_len: int = SEQ_LEN) -> np.ndarray:
    tokens = np.asarray(tokens, dtype=np.int64)
    count = (len(tokens) - 1) // seq_len
    return np.stack([tokens[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)])


def tail_split(tokens: list[int], config: JobConfig) -> tuple[list[int], list[int]]:
    """The documented held-out tail: max(seq_len + 1, int(n * val_fraction)) tokens."""
    cut = len(tokens) - max(config.model.seq_len + 1, int(len(tokens) * config.data.val_fraction))
    return tokens[:cut], tokens[cut:]


def expected_train_rows(rows: np.ndarray | list, config: JobConfig, step: int, index: int, size: int) -> list:
    """Items of micro-batch `index` of `step`: stream positions step*B + index*size ..., each epoch
    the (seed, epoch) permutation of the items, looked up one position at a time."""
    count = len(rows)
    picked = []
    for position in range(step * config.global_batch + index * size, step * config.global_batch + index * size + size):
        epoch, offset = divmod(position, count)
        picked.append(rows[int(permuted(count, config.seed, epoch, np.array([offset]))[0])])
    return picked


def expected_val_rows(rows, config: JobConfig, batch: int, index: int, size: int) -> list:
    """The documented rule: the pass's items spread evenly over the split (all, wrapping, if fewer)."""
    total = config.data.val_batches * config.global_batch
    first = batch * config.global_batch + index * size
    spread = (lambda k: k % len(rows)) if total >= len(rows) else (lambda k: k * len(rows) // total)
    return [rows[spread(first + k)] for k in range(size)]


def as_pair(rows: list) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.as_tensor(np.stack(rows), dtype=torch.int64)
    return stacked[:, :-1], stacked[:, 1:]


def assert_token_batches(config: JobConfig, train_tokens: list[int], val_tokens: list[int]) -> Batches:
    """Every TRIPLES micro-batch and two validation micro-batches equal the independently computed
    tokens, on two Batches objects (two ranks)."""
    train_rows, val_rows = windows(train_tokens, config.model.seq_len), windows(val_tokens, config.model.seq_len)
    ranks = [Batches(config), Batches(config)]
    for batches in ranks:
        assert len(batches.dataset.train) == len(train_rows) and len(batches.dataset.val) == len(val_rows)
        for step, index, size in TRIPLES:
            got = batches.train(step=step, index=index, size=size)
            want = as_pair(expected_train_rows(train_rows, config, step, index, size))
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
        for batch, index in ((0, 0), (1, 1)):
            got = batches.val(batch=batch, index=index, size=2)
            want = as_pair(expected_val_rows(val_rows, config, batch, index, 2))
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
    return ranks[0]


def corpus(seed: int, length: int) -> str:
    """Text with multi-byte characters and newlines (so chunking and UTF-8 both matter)."""
    rng = np.random.default_rng(seed)
    alphabet = [*"abcdefghij klmnop\nqrstuvwxyz.,", "é", "日本", "ß", "🙂"]
    return "".join(alphabet[i] for i in rng.integers(0, len(alphabet), length))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_s3():
    """moto in server mode on a free 127.0.0.1 port (as tests/orchestration/conftest.py does for EC2)."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(moto_s3, monkeypatch):
    """(client, bucket): a fresh bucket on moto; boto3 in the code under test finds it through
    AWS_ENDPOINT_URL, as on a node."""
    import boto3

    for name, value in (("AWS_ENDPOINT_URL", moto_s3), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3")
    bucket = f"data-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket
