"""One interface over every data format: a `Dataset` with a train and a validation split, and
`Batches`, what a worker asks for micro-batch `j` of step `t` (see `sampler` for the rule).

Each format is one module (`runtime/data/formats/<format>.py`) with `open_source(uri, spec, model, cache)`
returning a `Dataset`; `open_dataset` picks it by the source's format.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from runtime.config import DataSpec, JobConfig, ModelSpec, SourceURI, parse_source
from runtime.data.errors import DataError
from runtime.data.hygiene import cache_root, evict_corpora
from runtime.data.sampler import EpochPermutations, train_positions, val_positions

PREFETCH_STEPS = 2
"""Steps ahead whose samples a streamed source (`Split.prefetch`) starts fetching at each step."""


class Split(Protocol):
    """A map-style collection of samples."""

    def __len__(self) -> int: ...

    def take(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples `ids`, stacked: (inputs, targets)."""
        ...


class TokenWindows:
    """A flat array of token ids cut into non-overlapping windows of `seq_len` + 1 tokens (inputs and
    the targets shifted by one). The array may be a `numpy.memmap`: only the windows taken are read."""

    def __init__(self, tokens: np.ndarray, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        self.count = max(0, (len(tokens) - 1) // seq_len)

    def __len__(self) -> int:
        return self.count

    def take(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.seq_len
        rows = np.stack([np.asarray(self.tokens[i * length : i * length + length + 1]) for i in ids])
        rows = torch.from_numpy(rows.astype(np.int64))
        return rows[:, :-1], rows[:, 1:]  # (B, T), (B, T)


def stand_in_windows(seq_len: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets shaped and typed as `TokenWindows.take` gives them (every token 0): what a
    client checks and measures a model with when the data are only on the nodes."""
    rows = torch.zeros((size, seq_len), dtype=torch.int64)
    return rows, rows.clone()


def microbatch_data(
    spec: ModelSpec, *, seed: int, step: int, index: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and targets of global micro-batch `index` of `step` (a job without
    `data.source`): random tokens (or features) drawn from (seed, step, index) alone, so the same on
    every node."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 10_007 + index) & 0x7FFF_FFFF_FFFF)
    if spec.kind == "gpt":
        tokens = torch.randint(0, spec.vocab_size, (size, spec.seq_len + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]  # (B, T), (B, T)
    x = torch.randn(size, spec.in_features, generator=gen)
    return x, torch.randint(0, spec.vocab_size, (size,), generator=gen)


class MapSplit:
    """A user's map-style dataset (`__len__`, `__getitem__(i) -> (input, target)`), or a range of it."""

    def __init__(self, items: Any, start: int = 0, stop: int | None = None) -> None:
        self.items = items
        self.start = start
        self.stop = len(items) if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    def take(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.items[self.start + int(i)] for i in ids]
        return torch.stack([torch.as_tensor(x) for x, _ in pairs]), torch.stack([torch.as_tensor(y) for _, y in pairs])


@dataclass(kw_only=True, slots=True)
class Dataset:
    """A source opened on this node."""

    train: Split
    val: Split
    description: dict[str, Any] = field(default_factory=dict)
    """What a run records about its data (`spotpipe.json`): the source, its content hash, the
    tokenizer, and the size of each split."""


def open_dataset(spec: DataSpec, model: ModelSpec, *, cache_dir: Path | None = None) -> Dataset:
    """Open `spec.source` on this node; raises `DataError` naming what is wrong."""
    uri: SourceURI = parse_source(spec.source)
    module = importlib.import_module(f"runtime.data.formats.{uri.format}")
    root = cache_root(cache_dir)
    dataset = module.open_source(uri, spec, model, root)
    evict_corpora(root, spec.cache_bytes)  # what this open added may push older corpora out
    for name, split in (("training", dataset.train), ("validation", dataset.val)):
        if len(split) < 1:
            raise DataError(f"{spec.source}: the {name} split has no complete sample "
                            f"(seq_len={model.seq_len} needs at least {model.seq_len + 1} tokens)")
    return dataset


class Batches:
    """The micro-batches of a job, synthetic or from its data: the same tensors on every node."""

    def __init__(self, config: JobConfig, *, cache_dir: Path | None = None) -> None:
        self.config = config
        self.dataset = open_dataset(config.data, config.model, cache_dir=cache_dir) if config.data.source else None
        self._order = EpochPermutations(len(self.dataset.train), config.seed) if self.dataset else None

    def train(self, *, step: int, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of micro-batch `index` (of `size` samples) of `step`."""
        if self.dataset is None:
            return microbatch_data(self.config.model, seed=self.config.seed, step=step, index=index, size=size)
        batch = self.config.global_batch
        first, count = train_positions(step=step, index=index, size=size, global_batch=batch)
        prefetch = getattr(self.dataset.train, "prefetch", None)
        if prefetch is not None:  # a streamed source: the same micro-batch of the next steps, in the background
            last = self.config.steps - 1 if self.config.steps else step + PREFETCH_STEPS
            ahead = [self._order.items(first + k * batch, count) for k in range(1, PREFETCH_STEPS + 1)
                     if step + k <= last]
            if ahead:
                prefetch(np.concatenate(ahead))
        return self.dataset.train.take(self._order.items(first, count))

    def close(self) -> None:
        """Stop a streamed source's background fetches (waiting for those running)."""
        for split in (self.dataset.train, self.dataset.val) if self.dataset else ():
            if (close := getattr(split, "close", None)) is not None:
                close()

    def val(self, *, batch: int, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of micro-batch `index` of validation batch `batch` (held-out data)."""
        if self.dataset is None:
            raise DataError("synthetic data has no validation split; set data.source")
        ids = val_positions(batch=batch, index=index, size=size, global_batch=self.config.global_batch,
                            batches=self.config.data.val_batches, length=len(self.dataset.val))
        return self.dataset.val.take(ids)
