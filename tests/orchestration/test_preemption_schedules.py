"""Time-scaled preemption plans for local nodes, from the simulator's traces (whose loaders and
synthetic generator are tested in tests/sim)."""

from __future__ import annotations

import pytest

from controlplane.orchestration.providers.local.preemption import preemption_plan, removal_groups
from runtime.sim.synthetic import synthetic_trace
from runtime.traces import load_trace


def test_preemption_plan_scales_time_and_is_seeded(shared_data):
    trace = load_trace(shared_data / "traces" / "aws-g4dn-bamboo.csv")
    plan = preemption_plan(trace, time_scale=0.001, seed=1, notice_fraction=0.5)
    again = preemption_plan(trace, time_scale=0.001, seed=1, notice_fraction=0.5)
    assert plan == again
    assert sum(p.count for p in plan) == 74 == trace.preemptions()
    first_t, _ = removal_groups(trace)[0]
    assert plan[0].at_s == pytest.approx(first_t * 0.001)
    assert {p.with_notice for p in plan} == {True, False}


def test_bursts_stay_one_event_and_the_limit_cuts_the_plan(shared_data):
    trace = load_trace(shared_data / "traces" / "aws-p3.2xlarge-bamboo.csv")
    plan = preemption_plan(trace, time_scale=1.0)
    assert len(plan) == trace.preemption_events()
    assert sum(p.count for p in plan) == 167
    cut = preemption_plan(trace, time_scale=1.0, limit_s=plan[2].at_s)
    assert [p.at_s for p in cut] == [p.at_s for p in plan[:3]]


def test_synthetic_plan_is_deterministic_by_seed():
    a = preemption_plan(synthetic_trace(nodes=8, hours=24, seed=3), time_scale=0.01, seed=3)
    b = preemption_plan(synthetic_trace(nodes=8, hours=24, seed=3), time_scale=0.01, seed=3)
    c = preemption_plan(synthetic_trace(nodes=8, hours=24, seed=4), time_scale=0.01, seed=4)
    assert a == b and a
    assert a != c
