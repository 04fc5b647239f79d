"""Checkpoint interval: Young's first-order optimum and Daly's higher-order refinement."""

from __future__ import annotations

import math


def young_interval(*, checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young (1974): compute time between checkpoints that minimises expected waste, sqrt(2 C M)."""
    if checkpoint_cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"checkpoint_cost_s={checkpoint_cost_s} must be >= 0 and mtbf_s={mtbf_s} > 0")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def daly_interval(*, checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly (2006): sqrt(2CM) * (1 + sqrt(C/2M)/3 + C/(18M)) - C for C < 2M, else M."""
    young_interval(checkpoint_cost_s=checkpoint_cost_s, mtbf_s=mtbf_s)  # validates
    c, m = checkpoint_cost_s, mtbf_s
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def expected_waste_fraction(*, interval_s: float, checkpoint_cost_s: float, mtbf_s: float, restart_s: float) -> float:
    """First-order fraction of wall time lost: checkpoint writes C/T plus (T/2 + R)/M rework per failure."""
    if interval_s <= 0:
        raise ValueError(f"interval_s={interval_s} must be positive")
    return checkpoint_cost_s / interval_s + (interval_s / 2.0 + restart_s) / mtbf_s
