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
