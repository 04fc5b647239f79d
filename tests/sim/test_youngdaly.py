"""Young's and Daly's checkpoint intervals."""

from __future__ import annotations

import math

import pytest

from runtime.checkpointing.youngdaly import daly_interval, expected_waste_fraction, young_interval


def test_young_is_sqrt_2cm():
    assert young_interval(checkpoint_cost_s=30, mtbf_s=3600) == pytest.approx(math.sqrt(2 * 30 * 3600))


def test_daly_close_to_young_minus_cost_for_small_cost():
    y = young_interval(checkpoint_cost_s=1, mtbf_s=100_000)
    d = daly_interval(checkpoint_cost_s=1, mtbf_s=100_000)
    assert d == pytest.approx(y - 1, rel=0.01)
    assert daly_interval(checkpoint_cost_s=500, mtbf_s=100) == 100  # C >= 2M: checkpoint every MTBF


def test_young_interval_minimises_first_order_waste():
    c, m = 30.0, 3600.0
    best = young_interval(checkpoint_cost_s=c, mtbf_s=m)
    at_best = expected_waste_fraction(interval_s=best, checkpoint_cost_s=c, mtbf_s=m, restart_s=0)
    for factor in (0.5, 0.8, 1.25, 2.0):
        other = expected_waste_fraction(interval_s=best * factor, checkpoint_cost_s=c, mtbf_s=m, restart_s=0)
        assert other > at_best


def test_bad_inputs():
    with pytest.raises(ValueError, match="mtbf_s"):
        young_interval(checkpoint_cost_s=1, mtbf_s=0)
