"""Trace loading and the synthetic preemption generator, calibrated to the real traces."""

from __future__ import annotations

import pytest

from controlplane.orchestration.local.preemption import (
    TraceFormatError,
    load_trace,
    preemption_plan,
    synthetic_trace,
)

# (file, preemptions, rate per node-hour) from the reference data README.
TRACES = [
    ("aws-p3.2xlarge-bamboo.csv", 167, 0.61),
    ("aws-g4dn-bamboo.csv", 74, 0.55),
    ("gcp-a100-east1b-bamboo.txt", 154, 0.10),
    ("aws-v100-1node-us-east-1c-skypilot.json", 41, 0.34),
]


@pytest.mark.parametrize(("name", "preemptions", "rate"), TRACES)
def test_loads_every_trace_format(shared_data, name, preemptions, rate):
    stats = load_trace(shared_data / "traces" / name).stats()
    assert stats.preemptions == preemptions
    assert stats.rate_per_node_hour == pytest.approx(rate, abs=0.01)


def test_bamboo_trace_is_bursty(shared_data):
    stats = load_trace(shared_data / "traces" / "aws-p3.2xlarge-bamboo.csv").stats()
    assert stats.nodes_per_event == pytest.approx(2.1, abs=0.05)
    assert stats.max_nodes == 32


def test_synthetic_same_seed_same_schedule_and_calibrated(shared_data):
    a = synthetic_trace(seed=7, nodes=32, duration_s=48 * 3600)
    b = synthetic_trace(seed=7, nodes=32, duration_s=48 * 3600)
    c = synthetic_trace(seed=8, nodes=32, duration_s=48 * 3600)
    assert a.events == b.events
    assert a.events != c.events
    real = [load_trace(shared_data / "traces" / name).stats().rate_per_node_hour for name, _, _ in TRACES]
    for trace in (a, c):
        stats = trace.stats()
        # Within the band of the real traces (0.1-0.6 per node-hour) and bursty like Bamboo's.
        assert min(real) <= stats.rate_per_node_hour <= max(real)
        assert 0.1 <= stats.rate_per_node_hour <= 0.6
        assert stats.nodes_per_event > 1.5


def test_preemption_plan_scales_time_and_is_seeded(shared_data):
    trace = load_trace(shared_data / "traces" / "aws-g4dn-bamboo.csv")
    plan = preemption_plan(trace, time_scale=0.001, seed=1, notice_fraction=0.5)
    again = preemption_plan(trace, time_scale=0.001, seed=1, notice_fraction=0.5)
    assert plan == again
    assert sum(p.count for p in plan) == 74
    first_t, _ = trace.removal_groups()[0]
    assert plan[0].at_s == pytest.approx(first_t * 0.001)
    assert {p.with_notice for p in plan} == {True, False}


def test_bad_trace_line_names_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,node1\n5,explode,node1\n")
    with pytest.raises(TraceFormatError, match=r"bad\.csv:2"):
        load_trace(bad)
