"""`tokens:` nanoGPT's token files: flat binaries of token ids (uint16, or uint32 with
`?dtype=uint32`), read with `numpy.memmap`, never loaded whole. The location is a folder with
`train.bin` and `val.bin`, or one file whose tail (`data.val_fraction`) is held out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.config import DataSpec, ModelSpec
from runtime.data.dataset import DataError, Dataset, TokenWindows
from runtime.data.uri import SourceURI


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


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    dtype = uri.options["dtype"]
    root = Path(uri.location)
    if root.is_dir():
        train, val = open_token_file(root / "train.bin", dtype), open_token_file(root / "val.bin", dtype)
    else:
        tokens = open_token_file(root, dtype)
        cut = len(tokens) - max(model.seq_len + 1, int(len(tokens) * spec.val_fraction))
        if cut < model.seq_len + 1:
            raise DataError(f"token file {root} has {len(tokens)} tokens: too few for a training and a validation "
                            f"split of at least {model.seq_len + 1} tokens each")
        train, val = tokens[:cut], tokens[cut:]
    for name, part in (("training", train), ("validation", val)):
        check_vocabulary(part, model.vocab_size, f"{uri} ({name} split)")
    return Dataset(
        train=TokenWindows(train, model.seq_len),
        val=TokenWindows(val, model.seq_len),
        description={"source": str(uri), "format": "tokens", "train_tokens": len(train), "val_tokens": len(val)},
    )
