"""Deterministic sampling: which samples micro-batch `j` of step `t` reads.

The rule (docs/data.md, "Determinism"): the training samples form one stream, epoch after epoch,
each epoch a permutation of the dataset's items keyed by (seed, epoch) (`permuted`: a Feistel
network, so a lookup costs the same for a corpus of any size and no per-epoch table is held). Step `t` reads positions
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

MASK64 = (1 << 64) - 1
ROUNDS = 4


def _mix64(x):
    """splitmix64's finalizer, on a Python int or a uint64 array (wrapping mod 2**64)."""
    if isinstance(x, int):
        x &= MASK64
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & MASK64
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & MASK64
        return x ^ (x >> 31)
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def round_keys(seed: int, epoch: int) -> list[int]:
    """The Feistel round keys of (seed, epoch)."""
    base = _mix64((_mix64(seed & MASK64) * 0x9E3779B97F4A7C15 + epoch) & MASK64)  # (seed, epoch) ordered
    return [_mix64(base ^ ((r + 1) * 0x9E3779B97F4A7C15 & MASK64)) for r in range(ROUNDS)]


def permuted(size: int, seed: int, epoch: int, offsets: np.ndarray) -> np.ndarray:
    """Item ids at `offsets` of epoch `epoch`'s permutation of range(size): a 4-round Feistel network
    on the smallest even number of bits covering size - 1, keyed by (seed, epoch), cycle-walked back
    into range. Each lookup costs the same whatever `size`: no table of `size` entries is built."""
    half = max(1, ((size - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    keys = [np.uint64(k) for k in round_keys(seed, epoch)]

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for key in keys:
            left, right = right, left ^ (_mix64(right ^ key) & mask)
        return (left << shift) | right

    out = feistel(np.asarray(offsets, dtype=np.uint64))
    outside = out >= np.uint64(size)
    while outside.any():  # the network permutes [0, 4**half); walking its cycles stays in [0, size)
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(size)
    return out.astype(np.int64)


class EpochPermutations:
    """The stream of item ids: epoch after epoch, each a permutation of the items (`permuted`)."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("a dataset with no samples cannot be sampled")
        self.size = size
        self.seed = seed

    def items(self, first: int, count: int) -> np.ndarray:
        """Item ids at stream positions first .. first + count - 1."""
        positions = np.arange(first, first + count, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.size)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):  # one call per epoch the positions cross
            chosen = epochs == epoch
            out[chosen] = permuted(self.size, self.seed, int(epoch), offsets[chosen])
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
