"""`tokens:` nanoGPT's token files: flat binaries of token ids (uint16, or uint32 with
`?dtype=uint32`), read with `numpy.memmap`, never loaded whole. The location is a folder with
`train.bin` and `val.bin`, or one file whose tail (`data.val_fraction`) is held out; either may be on
S3 (`s3://bucket/prefix/` with both files, or `s3://bucket/key`), mirrored into the node cache.
The node cache's tokenized corpora are in this format too (`runtime.data.cache`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.dataset import DataError, Dataset, TokenWindows


def open_token_file(path: Path, dtype: str) -> np.ndarray:
    """A token file as a read-only memmap; `DataError` when it is missing, empty or its size is not
    a multiple of the token width."""
    if not path.is_file():
        raise DataError(f"token file {path} does not exist on this node")
    width = np.dtype(dtype).itemsize
    size = path.stat().st_size
    if size == 0 or size % width:
        raise DataError(f"token file {path} has {size} bytes, not a positive multiple of {width} ({dtype} tokens)")
    return np.memmap(path, dtype=dtype, mode="r")


def check_vocabulary(tokens: np.ndarray, vocab_size: int, name: str, chunk: int = 1 << 24) -> None:
    """`DataError` when a token id is beyond the model's vocabulary (read in chunks, not whole)."""
    top = 0
    for start in range(0, len(tokens), chunk):
        top = max(top, int(tokens[start : start + chunk].max()))
    if top >= vocab_size:
        raise DataError(f"{name} holds token id {top}, beyond the model's vocabulary "
                        f"(model.vocab_size={vocab_size}); expected ids below {vocab_size}")


def hold_out_tail_cut(count: int, spec: DataSpec, model: ModelSpec, name: str) -> int:
    """Where the held-out tail of a stream of `count` tokens starts: the last `val_fraction` of the
    tokens (at least one window, seq_len + 1 tokens) are held out."""
    cut = count - max(model.seq_len + 1, int(count * spec.val_fraction))
    if cut < model.seq_len + 1:
        raise DataError(f"{name} has {count} tokens: too few for a training and a validation "
                        f"split of at least {model.seq_len + 1} tokens each")
    return cut


def hold_out_tail(tokens: np.ndarray, spec: DataSpec, model: ModelSpec, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) of one token stream (`hold_out_tail_cut`)."""
    cut = hold_out_tail_cut(len(tokens), spec, model, name)
    return tokens[:cut], tokens[cut:]


def windows_dataset(train: np.ndarray, val: np.ndarray, model: ModelSpec, description: dict) -> Dataset:
    return Dataset(
        train=TokenWindows(train, model.seq_len),
        val=TokenWindows(val, model.seq_len),
        description={**description, "train_tokens": len(train), "val_tokens": len(val)},
    )


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    from runtime.data.files import local_root

    dtype = uri.options["dtype"]
    root = local_root(uri, cache_dir)
    if root.is_dir():
        train, val = open_token_file(root / "train.bin", dtype), open_token_file(root / "val.bin", dtype)
    else:
        train, val = hold_out_tail(open_token_file(root, dtype), spec, model, f"token file {root}")
    for name, part in (("training", train), ("validation", val)):
        check_vocabulary(part, model.vocab_size, f"{uri} ({name} split)")
    return windows_dataset(train, val, model, {"source": str(uri), "format": "tokens"})
