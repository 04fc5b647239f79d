"""The synthetic trace generator: deterministic per seed, calibrated rate and burst size."""

from __future__ import annotations

import pytest

from runtime.sim.synthetic import synthetic_trace


def test_same_seed_same_trace_other_seed_differs():
    a = synthetic_trace(nodes=64, hours=12, rate_per_node_hour=0.3, seed=7)
    b = synthetic_trace(nodes=64, hours=12, rate_per_node_hour=0.3, seed=7)
    c = synthetic_trace(nodes=64, hours=12, rate_per_node_hour=0.3, seed=8)
    assert a.events == b.events
    assert a.events != c.events


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.6])
def test_rate_calibrated_within_band(rate):
    trace = synthetic_trace(nodes=200, hours=24, rate_per_node_hour=rate, mean_burst=2.0, seed=1)
    measured = trace.preemption_rate()
    assert measured == pytest.approx(rate, rel=0.15)
    assert 0.08 <= measured <= 0.7


def test_bursty_like_the_public_traces():
    trace = synthetic_trace(nodes=200, hours=24, rate_per_node_hour=0.3, mean_burst=2.1, seed=3)
    assert trace.mean_burst() == pytest.approx(2.1, rel=0.15)
    single = synthetic_trace(nodes=200, hours=24, rate_per_node_hour=0.3, mean_burst=1.0, seed=3)
    assert single.mean_burst() == 1.0


def test_replacements_follow_the_delay_and_can_be_off():
    trace = synthetic_trace(nodes=50, hours=6, rate_per_node_hour=0.5, replacement_delay_s=300, seed=2)
    assert trace.replacements() > 0
    none = synthetic_trace(nodes=50, hours=6, rate_per_node_hour=0.5, replace=False, seed=2)
    assert none.replacements() == 0
    assert none.node_count_series()[-1][1] == 50 - none.preemptions()


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="mean_burst"):
        synthetic_trace(nodes=4, hours=1, mean_burst=0.5)
    with pytest.raises(ValueError, match="nodes"):
        synthetic_trace(nodes=0, hours=1)
