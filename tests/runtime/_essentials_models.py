"""Data for tests/runtime/test_training_essentials.py, imported by the ranks by path."""

from __future__ import annotations

import torch

from tests.usermodels.models import regression

POISONED_ITEM = 4
"""The training item whose features are infinite: the step that reads it has non-finite gradients."""


def regression_with_inf(split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`tests.usermodels.models.regression` with one infinite training sample."""
    items = regression(split)
    if split == "train":
        x, y = items[POISONED_ITEM]
        items[POISONED_ITEM] = (torch.full_like(x, float("inf")), y)
    return items


def dropout_mlp(p: float = 0.3) -> list:
    """6 features -> 2 outputs with dropout in the hidden layers (layer factories)."""
    return [
        lambda: torch.nn.Linear(6, 16),
        lambda: torch.nn.Sequential(torch.nn.Dropout(p), torch.nn.Linear(16, 16), torch.nn.Tanh()),
        lambda: torch.nn.Sequential(torch.nn.Dropout(p), torch.nn.Linear(16, 2)),
    ]
