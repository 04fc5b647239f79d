"""The demo's preemption schedule: a trace compressed onto the job's progress, seeded."""

from __future__ import annotations

import pytest

from runtime.traces import ADD, REMOVE, Trace, TraceEvent
from spotpipe.demo import preemption_script
from spotpipe.demo.driver import layout_for


def _trace(removals: list[tuple[float, int]]) -> Trace:
    events = [TraceEvent(0.0, ADD, f"node{i}") for i in range(4)]
    serial = 0
    for t, count in removals:
        for _ in range(count):
            events.append(TraceEvent(t, REMOVE, f"node{serial % 4}"))
            serial += 1
    return Trace(name="t", events=events, duration_s=10_000)


def test_same_seed_same_schedule_and_different_seed_differs():
    trace = preemption_script.demo_trace(nodes=4, seed=3)
    a = preemption_script.demo_schedule(trace, seed=3, dp=2, pp=2, max_events=3)
    assert a == preemption_script.demo_schedule(preemption_script.demo_trace(nodes=4, seed=3), seed=3, dp=2, pp=2,
                                                max_events=3)
    others = [preemption_script.demo_schedule(preemption_script.demo_trace(nodes=4, seed=s), seed=s, dp=2, pp=2,
                                              max_events=3)
              for s in range(4, 8)]
    assert any(o != a for o in others)


def test_trace_time_is_compressed_onto_the_window_of_the_job():
    plan = preemption_script.demo_schedule(_trace([(100.0, 1), (300.0, 2), (400.0, 1), (900.0, 1)]), seed=0, dp=2, pp=2,
                                                max_events=3)
    assert [p.trace_t_s for p in plan] == [100.0, 300.0, 400.0]
    assert [p.count for p in plan] == [1, 2, 1]
    lo, hi = preemption_script.WINDOW
    assert plan[-1].at_fraction == pytest.approx(hi)
    assert plan[0].at_fraction == pytest.approx(lo + (hi - lo) * 100 / 400)
    assert [p.at_fraction for p in plan] == sorted(p.at_fraction for p in plan)


@pytest.mark.parametrize("seed", range(20))
def test_a_demo_always_shows_both_kinds_of_preemption(seed):
    plan = preemption_script.demo_schedule(_trace([(10.0, 1), (20.0, 1)]), seed=seed, dp=2, pp=2, max_events=2)
    assert {p.with_notice for p in plan} == {True, False}


def test_victims_take_different_stages_first():
    (p,) = preemption_script.demo_schedule(_trace([(5.0, 3)]), seed=1, dp=2, pp=2, max_events=1)
    assert sorted(p.victims) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    first_two = p.victims[:2]
    assert {stage for _, stage in first_two} == {0, 1}
    assert {pipeline for pipeline, _ in first_two} == {0, 1}
    (q,) = preemption_script.demo_schedule(_trace([(5.0, 3)]), seed=2, dp=3, pp=2, max_events=1)
    assert sorted(stage for _, stage in q.victims[:2]) == [0, 1]
    assert len({pipeline for pipeline, _ in q.victims[:3]}) == 3
    assert preemption_script.max_survivable(dp=2, pp=2) == 2
    assert preemption_script.max_survivable(dp=1, pp=4) == 1


def test_layout_for_node_counts():
    assert layout_for(4) == (2, 2)
    assert layout_for(6) == (3, 2)
    assert layout_for(3) == (3, 1)
    assert layout_for(2) == (2, 1)
    with pytest.raises(ValueError, match="--nodes"):
        layout_for(0)


def test_a_trace_file_is_read(shared_data):
    trace = preemption_script.demo_trace(nodes=4, seed=0, path=shared_data / "traces" / "aws-g4dn-bamboo.csv")
    plan = preemption_script.demo_schedule(trace, seed=0, dp=2, pp=2, max_events=4)
    assert len(plan) == 4
    assert all(preemption_script.WINDOW[0] <= p.at_fraction <= preemption_script.WINDOW[1] for p in plan)


def test_timeline_labels_say_what_a_generation_did():
    from spotpipe.demo.driver import event_label

    assert event_label("generation", "generation 2: 3 workers (death [3]: reroute)") == "WORK RE-ROUTED"
    assert event_label("generation", "generation 3: 4 workers (1 node(s) joined; 0 hole(s) (grow))") == "GREW BACK"
    assert event_label("generation", "generation 4: 3 workers (notice [1]: restart)") == "RESTART"
    assert event_label("generation", "generation 1: 4 workers (initial membership)") == "new generation"
    assert event_label("instance_lost", "instance 3 lost: heartbeat timeout") == "NODE LOST"
    assert event_label("something_new", "x") == "something_new"
