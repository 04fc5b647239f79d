"""Deterministic sampling: which samples micro-batch `j` of step `t` reads.

The rule (docs/runtime.md, "Your data"): the training samples form one stream, epoch after epoch,
each epoch a permutation of the dataset's items seeded by (seed, epoch). Step `t` reads positions
`t * global_batch ...` of that stream and its micro-batch `j` (of `size` samples) the `size`
positions from `t * global_batch + j * size`. So what a micro-batch reads is a pure function of
(data, seed, t, j), whichever rank, pipeline or generation computes it: re-routed, taken-over,
re-instantiated and restarted work reads exactly the samples of the failure-free run.

Validation reads `val_batches * global_batch` held-out items spread evenly over the held-out split,
in order (no shuffling): item `k` of the pass is `k * len(split) // (val_batches * global_batch)`
(`k % len(split)` when the split has fewer items); val batch `b`, micro-batch `j` reads pass items
`b * global_batch + j * size ...`.
"""

from __future__ import annotations

import numpy as np


class EpochPermutations:
    """The seeded permutation of each epoch, computed once per epoch and kept (the latest two)."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("a dataset with no samples cannot be sampled")
        self.size = size
        self.seed = seed
        self._cache: dict[int, np.ndarray] = {}

    def epoch(self, number: int) -> np.ndarray:
        if number not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            # PCG64 with the (seed, epoch) pair as its seed sequence: the same on every platform.
            rng = np.random.Generator(np.random.PCG64([self.seed & 0xFFFF_FFFF_FFFF, number]))
            self._cache[number] = rng.permutation(self.size)
        return self._cache[number]

    def items(self, first: int, count: int) -> np.ndarray:
        """Item ids at stream positions first .. first + count - 1."""
        epoch, offset = divmod(first, self.size)
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:  # one slice per epoch the positions cross (not one lookup per position)
            take = min(count - done, self.size - offset)
            out[done : done + take] = self.epoch(epoch)[offset : offset + take]
            done += take
            epoch, offset = epoch + 1, 0
        return out


def train_positions(*, step: int, index: int, size: int, global_batch: int) -> tuple[int, int]:
    """(first stream position, count) of micro-batch `index` of `step`."""
    return step * global_batch + index * size, size


def val_positions(
    *, batch: int, index: int, size: int, global_batch: int, batches: int, length: int
) -> np.ndarray:
    """Held-out item ids of micro-batch `index` of validation batch `batch` (of `batches`): the
    pass reads `batches * global_batch` items spread evenly over the held-out split, in order (all
    of them, wrapping, when the split is smaller), so a pass samples the whole split, not its start."""
    total = batches * global_batch
    first = batch * global_batch + index * size
    k = np.arange(first, first + size, dtype=np.int64)
    return k % length if total >= length else (k * length) // total
