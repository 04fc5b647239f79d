"""What a corpus alone says about its loss: a model that learned nothing but token frequencies
reaches the unigram entropy; one that learned nothing at all, ln(vocab)."""

from __future__ import annotations

import numpy as np


def unigram_entropy(tokens: np.ndarray, vocab_size: int, chunk: int = 1 << 24) -> float:
    """Entropy (nats per token) of the token frequencies; read in chunks (a memmap is never loaded whole)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(tokens), chunk):
        counts += np.bincount(np.asarray(tokens[start : start + chunk]), minlength=vocab_size)[:vocab_size]
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
