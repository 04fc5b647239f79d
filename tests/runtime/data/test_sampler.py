"""The sampler's permutation (`runtime.data.sampler.permuted`): a bijection of range(n) for any n,
fixed by (seed, epoch) alone, different across seeds and epochs, the documented Feistel network
(checked against a plain-Python transcription of docs/data.md's rule), and the same cost per lookup
for a corpus of any size (no table of n entries)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.data.sampler import EpochPermutations, permuted

MASK = (1 << 64) - 1


def mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def documented(n: int, seed: int, epoch: int, offset: int) -> int:
    """docs/data.md, "Determinism", one offset at a time in plain integers."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    base = mix((mix(seed & MASK) * 0x9E3779B97F4A7C15 + epoch) & MASK)
    keys = [mix(base ^ ((r + 1) * 0x9E3779B97F4A7C15 & MASK)) for r in range(4)]

    def feistel(x: int) -> int:
        left, right = x >> half, x & ((1 << half) - 1)
        for key in keys:
            left, right = right, left ^ (mix(right ^ key) & ((1 << half) - 1))
        return (left << half) | right

    y = feistel(offset)
    while y >= n:
        y = feistel(y)
    return y


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4097])
def test_every_epoch_is_a_permutation_and_is_the_documented_one(n):
    for seed, epoch in ((0, 0), (3, 1), (2**40 + 5, 9)):
        got = permuted(n, seed, epoch, np.arange(n))
        assert sorted(got.tolist()) == list(range(n))
        assert got.tolist() == [documented(n, seed, epoch, k) for k in range(n)]


def test_seeds_and_epochs_give_different_orders_and_lookups_agree_with_the_stream():
    n = 1000
    orders = {(seed, epoch): tuple(permuted(n, seed, epoch, np.arange(n))) for seed in (1, 2) for epoch in (0, 1)}
    assert len(set(orders.values())) == 4
    stream = EpochPermutations(n, seed=2)
    both = stream.items(n - 5, 10)  # crosses from epoch 0 into epoch 1
    assert both.tolist() == [*orders[(2, 0)][-5:], *orders[(2, 1)][:5]]


def test_a_lookup_in_a_corpus_of_a_billion_windows_builds_no_table():
    offsets = np.arange(10**9 - 32, 10**9, dtype=np.int64)
    got = permuted(10**9, 5, 3, offsets)
    assert got.dtype == np.int64 and len(set(got.tolist())) == 32 and (got < 10**9).all()
    assert got.tolist() == [documented(10**9, 5, 3, int(k)) for k in offsets]
