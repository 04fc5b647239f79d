"""Where a simulated run's wall time goes (`SimResult.breakdown`), on tiny hand-checked traces,
and oobleck's fallback to its checkpoint when a burst takes every holder of a layer."""

from __future__ import annotations

import pytest

from runtime.sim.engine import STRATEGIES, TIME_BUCKETS, SimParams, simulate
from runtime.sim.iteration import IterationModel
from runtime.traces import ADD, REMOVE, Trace, TraceEvent
from tests.sim.test_engine import _with_extra_failures, make_model, steady


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_buckets_cover_the_trace_exactly(strategy):
    trace = Trace(name="three", events=_with_extra_failures(steady(), [1000.0, 3000.0, 5000.0]), duration_s=7200.0)
    result = simulate(trace, strategy=strategy, model=make_model())
    assert set(result.breakdown) == set(TIME_BUCKETS)
    assert all(v >= 0 for v in result.breakdown.values())
    assert sum(result.breakdown.values()) == pytest.approx(7200.0, abs=1e-6)
    assert result.breakdown["restarting"] > 0 and result.breakdown["redone"] > 0
    hours = result.summary()["time_breakdown_hours"]
    assert hours["training"] == pytest.approx(result.breakdown["training"] / 3600, abs=1e-4)


def test_checkpoint_restart_breakdown_by_hand():
    """2 x 2 nodes, a checkpoint (30 s) every 600 s of compute, restart 100 s, detection 5 s.
    n0 goes at 1000 s (hit: 370 s since the last write are redone), r0 joins at 1300 s (a second
    pipeline fits: save first, then restart), the trace ends at 3000 s."""
    events = [*steady(), TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(1300.0, ADD, "r0")]
    trace = Trace(name="t", events=events, duration_s=3000.0)
    params = SimParams(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0, restart_s=100.0,
                       detection_s=5.0, node_ready_s=0.0)
    result = simulate(trace, strategy="checkpoint", model=make_model(), params=params)
    b = result.breakdown
    # [0, 1000]: 600 s compute, 30 s write, 370 s compute lost.
    # [1000, 1300]: 5 s detection + 100 s restart, 195 s compute (kept: the grow saves first).
    # [1300, 3000]: 30 s save + 100 s restart, then 1570 s = 2 x (600 + 30) + 310 s of compute.
    assert b["training"] == pytest.approx(600.0 + 195.0 + 2 * 600.0 + 310.0)
    assert b["redone"] == pytest.approx(370.0)
    assert b["checkpointing"] == pytest.approx(30.0 + 30.0 + 2 * 30.0)
    assert b["restarting"] == pytest.approx(105.0 + 100.0)
    assert b["waiting"] == 0.0


def test_oobleck_breakdown_by_hand():
    """A loss costs oobleck detection + re-instantiation (paused), half a step redone; periodic
    checkpoints take their share C / (T + C) of the running time."""
    model = make_model()
    events = [*steady(), TraceEvent(1000.0, REMOVE, "n0")]
    trace = Trace(name="t", events=events, duration_s=2000.0)
    params = SimParams(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0, reconfigure_s=30.0, detection_s=5.0)
    result = simulate(trace, strategy="oobleck", model=model, params=params)
    b = result.breakdown
    running = 2000.0 - 35.0
    assert b["restarting"] == pytest.approx(35.0)
    assert b["checkpointing"] == pytest.approx(running * 30.0 / 630.0)
    assert b["redone"] == pytest.approx(0.5 * model.oobleck(4))
    assert b["training"] + b["redone"] == pytest.approx(running * 600.0 / 630.0)
    assert b["waiting"] == 0.0


def test_breakdown_counts_a_pause_cut_short_once():
    """Two losses 10 s apart: oobleck's second re-instantiation starts when the first ends (the
    pauses queue), and the time counted restarting is the wall time paused, never more."""
    events = [*steady(), TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(1010.0, REMOVE, "n1")]
    trace = Trace(name="t", events=events, duration_s=1030.0)
    params = SimParams(checkpoint_every_strategy=False, reconfigure_s=30.0, detection_s=5.0)
    result = simulate(trace, strategy="oobleck", model=make_model(), params=params)
    assert result.breakdown["restarting"] == pytest.approx(30.0)  # 1000 -> 1030, the trace's end
    assert sum(result.breakdown.values()) == pytest.approx(1030.0)


def test_oobleck_restores_when_a_burst_takes_every_holder_of_a_layer():
    """4 nodes, oobleck's template: 2 pipelines of 2 (n0 n1 | n2 n3). Losing n0 and n2 at once
    takes both copies of the first stage's layers: the runtime restores from its checkpoint
    (`falls_back_to_checkpoint`). Losing n0 and n1 (one whole pipeline) leaves a copy of every
    layer: oobleck re-instantiates on n2 n3."""
    model = make_model()
    params = SimParams(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0)
    assert model.oobleck_layers(4) == (frozenset({0, 1}), frozenset({2, 3}), frozenset({0, 1}), frozenset({2, 3}))

    def run(gone: tuple[str, str]):
        events = [*steady(), *(TraceEvent(1000.0, REMOVE, n) for n in gone)]
        return simulate(Trace(name="t", events=events, duration_s=2000.0), strategy="oobleck", model=model,
                        params=params)

    across, whole = run(("n0", "n2")), run(("n0", "n1"))
    assert across.restores == 1 and whole.restores == 0
    # The restore loses the compute since the last checkpoint (periodic writes are a duty cycle for
    # these strategies: 1000 s hold 1000 x 600 / 630 s of compute, 600 of them checkpointed) and
    # pays the restart; the re-instantiation loses half a step.
    assert across.breakdown["redone"] == pytest.approx(1000.0 * 600.0 / 630.0 - 600.0, rel=1e-9)
    assert across.breakdown["restarting"] == pytest.approx(params.detection_s + params.restart_total_s)
    assert whole.breakdown["redone"] < 1.0
    assert across.total_samples < whole.total_samples


def test_recycle_as_published_sends_a_lost_hop_to_same_stage_peers_only():
    """`IterationModel(recycle_spill=False)` plans recycle as ReCycle publishes it (the bench's
    recycle-peers row): every hop of stage s runs on a node of slot column s."""
    base = make_model()
    peers = IterationModel(spec=base.spec, dp=3, pp=2, microbatches=4, cost=base.cost, recycle_spill=False)
    pattern = ((False, True), (True, True), (True, True))
    layout = peers.plans.layout("recycle", pattern)
    assert layout.num_microbatches == 12
    for route in layout.routes:
        assert [node % 2 for _, node in route] == [0, 1]  # slot (p, s) holds node p * pp + s
    assert all(node != 0 for route in layout.routes for _, node in route)  # the lost slot's node
    assert peers.recycle((1, 0), pipelines=3) < float("inf")


def test_bamboo_fills_a_lost_slot_from_a_standing_by_node():
    """5 nodes, 2 x 2 job: n4 stands by. When n0 goes, its predecessor takes the stage over, and
    the runtime's next plan puts n4 into the empty slot (`make_plan` fills slots, spares first), so
    bamboo pays detection + failover + the joiner's switch and then runs its full step again
    (before: the takeover ran to the trace's end with n4 idle)."""
    model = make_model()
    params = SimParams(checkpoint_every_strategy=False, detection_s=5.0, bamboo_failover_s=10.0, join_s=1.0)
    events = [*steady(nodes=5), TraceEvent(1000.0, REMOVE, "n0")]
    result = simulate(Trace(name="t", events=events, duration_s=3000.0), strategy="bamboo", model=model, params=params)
    step = model.bamboo((True, True), pipelines=2)
    assert model.bamboo((False, True), pipelines=2) > step  # a takeover is slower
    rate = model.total_microbatches / step
    assert result.breakdown["restarting"] == pytest.approx(16.0)
    assert result.total_samples == pytest.approx(rate * (3000.0 - 16.0) - 0.5 * model.total_microbatches)


def test_bamboo_joiner_fills_a_taken_over_slot_with_a_switch_not_a_reconfiguration():
    """4 nodes: n0 goes at 1000 s (takeover: detection + failover), r0 is ready at 2000 s and fills
    the empty slot after `join_s`; no `reconfigure_s` is paid."""
    model = make_model()
    params = SimParams(checkpoint_every_strategy=False, detection_s=5.0, bamboo_failover_s=10.0, join_s=1.0,
                       reconfigure_s=30.0, node_ready_s=0.0)
    events = [*steady(), TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(2000.0, ADD, "r0")]
    result = simulate(Trace(name="t", events=events, duration_s=3000.0), strategy="bamboo", model=model, params=params)
    full = model.total_microbatches / model.bamboo((True, True), pipelines=2)
    taken = model.total_microbatches / model.bamboo((False, True), pipelines=2)
    assert result.breakdown["restarting"] == pytest.approx(15.0 + 1.0)
    expected = full * 1000.0 - 0.5 * model.total_microbatches + taken * (1000.0 - 15.0) + full * (1000.0 - 1.0)
    assert result.total_samples == pytest.approx(expected)


CHECKPOINT_PARAMS = dict(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0, restart_s=100.0, detection_s=5.0,
                         node_ready_s=0.0)


@pytest.mark.parametrize("bound", [250.0, 1e9])
def test_checkpoint_holds_joiners_until_a_batch_is_worth_a_restart(bound):
    """The runtime's rule (`joiners_worth_a_regroup`): n0 and n1 go at 1000 s (detection + restart,
    one pipeline left, two slots empty); r0 joins at 1300 s: one of two empty slots and no new
    pipeline, so it waits. r1 joins at 1500 s, before r0 waited `join_batch_wait_s` (any bound over
    200 s): the two fill every empty slot, and the job saves (30 s) and restarts (100 s) once, into
    two pipelines (before: a restart for each joiner)."""
    model = make_model()
    events = [*steady(), TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(1000.0, REMOVE, "n1"),
              TraceEvent(1300.0, ADD, "r0"), TraceEvent(1500.0, ADD, "r1")]
    params = SimParams(join_batch_wait_s=bound, **CHECKPOINT_PARAMS)
    result = simulate(Trace(name="t", events=events, duration_s=3000.0), strategy="checkpoint", model=model,
                      params=params)
    b = result.breakdown
    two, one = (model.total_microbatches / model.full_pipelines(n) for n in (2, 1))
    assert b["redone"] == pytest.approx(370.0)
    assert result.joiner_regroups == 1
    # [0, 1000]: 600 s compute, a write, 370 s lost; [1000, 1105] detection + restart; one pipeline
    # from 1105 s; then the restart for r1 at 1500 s: [1630, 3000] = 2 x (600 + 30) + 110 s.
    assert b["restarting"] == pytest.approx(105.0 + 100.0)
    assert b["checkpointing"] == pytest.approx(30.0 + 30.0 + 2 * 30.0)
    assert result.total_samples == pytest.approx(two * 600.0 + one * 395.0 + two * (1200.0 + 110.0))


def test_checkpoint_takes_a_lone_joiner_once_it_waited_the_bound():
    """As above without r1: r0 waits `join_batch_wait_s` (300 s), then the job saves and restarts
    for it at 1600 s (one pipeline still, r0 standing by in the layout); with a bound past the
    trace's end it never restarts for it."""
    model = make_model()
    events = [*steady(), TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(1000.0, REMOVE, "n1"),
              TraceEvent(1300.0, ADD, "r0")]
    one = model.total_microbatches / model.full_pipelines(1)
    two = model.total_microbatches / model.full_pipelines(2)

    def run(bound: float):
        return simulate(Trace(name="t", events=events, duration_s=3000.0), strategy="checkpoint", model=model,
                        params=SimParams(join_batch_wait_s=bound, **CHECKPOINT_PARAMS))

    waited, held = run(300.0), run(1e9)
    assert (waited.joiner_regroups, held.joiner_regroups) == (1, 0)
    assert waited.breakdown["restarting"] == pytest.approx(105.0 + 100.0)
    assert waited.breakdown["checkpointing"] == pytest.approx(30.0 + 30.0 + 2 * 30.0)
    # [1105, 1600] one pipeline, save + restart, [1730, 3000] = 2 x (600 + 30) + 10 s.
    assert waited.total_samples == pytest.approx(two * 600.0 + one * (495.0 + 1210.0))
    assert held.breakdown["restarting"] == pytest.approx(105.0)
    assert held.breakdown["checkpointing"] == pytest.approx(30.0 + 3 * 30.0)
    # [1105, 3000] = 3 x (600 + 30) + 5 s of one pipeline.
    assert held.total_samples == pytest.approx(two * 600.0 + one * 1805.0)


def test_oobleck_holds_joiners_until_a_batch_is_worth_a_reinstantiation():
    """n0 and n1 (one whole pipeline) go at 1000 s: oobleck re-instantiates on n2 n3 (detection +
    30 s). r0 joins at 2000 s: one of two empty slots and no new pipeline of pp=2, so it waits; after
    `join_batch_wait_s` (300 s) oobleck re-plans over 3 nodes (30 s, no detection). Two joiners at
    2000 s fill every empty slot: re-planned over 4 nodes at once."""
    model = make_model()
    lost = [*steady(), TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(1000.0, REMOVE, "n1")]
    params = SimParams(checkpoint_every_strategy=False, reconfigure_s=30.0, detection_s=5.0, node_ready_s=0.0,
                       join_batch_wait_s=300.0)
    rate = {n: model.total_microbatches / model.oobleck(n) for n in (4, 3, 2)}
    assert rate[4] > rate[3] > rate[2]
    before = rate[4] * 1000.0 - 0.5 * model.total_microbatches + rate[2] * 965.0

    lone = simulate(Trace(name="t", events=[*lost, TraceEvent(2000.0, ADD, "r0")], duration_s=3000.0),
                    strategy="oobleck", model=model, params=params)
    assert lone.breakdown["restarting"] == pytest.approx(35.0 + 30.0)
    assert lone.joiner_regroups == 1
    assert lone.total_samples == pytest.approx(before + rate[2] * 300.0 + rate[3] * 670.0)

    pair = [TraceEvent(2000.0, ADD, "r0"), TraceEvent(2000.0, ADD, "r1")]
    both = simulate(Trace(name="t", events=[*lost, *pair], duration_s=3000.0), strategy="oobleck", model=model,
                    params=params)
    assert both.breakdown["restarting"] == pytest.approx(35.0 + 30.0)
    assert both.joiner_regroups == 1
    assert both.total_samples == pytest.approx(before + rate[4] * 970.0)


def test_checkpoint_restarts_when_a_standing_by_member_goes():
    """3 nodes of a 2 x 2 job: one pipeline (n0 n1) and n2 standing by, a member of the layout
    (`CheckpointStrategy` standby) and of the generation's commit. Its loss fails the generation
    like a working node's: 370 s of work redone, detection + restart paid."""
    model = make_model()
    events = [*steady(nodes=3), TraceEvent(1000.0, REMOVE, "n2")]
    params = SimParams(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0, restart_s=100.0, detection_s=5.0)
    result = simulate(Trace(name="t", events=events, duration_s=2000.0), strategy="checkpoint", model=model,
                      params=params)
    assert result.breakdown["restarting"] == pytest.approx(105.0)
    assert result.breakdown["redone"] == pytest.approx(370.0)
    one = model.total_microbatches / model.full_pipelines(1)
    assert result.total_samples == pytest.approx(one * (600.0 + 600.0 + 265.0))


def test_joiners_during_a_regroup_join_it():
    """A node ready while the job regroups is in the new generation without a pause of its own
    (Bamboo's simulator adds it to the rendezvous in progress): oobleck re-instantiating after
    losing n0 n1 at 1000 s (until 1035 s) takes r0 (ready at 1010 s) in; checkpoint-restart
    restarting (until 1105 s) takes r0 and r1 in and resumes with two pipelines."""
    model = make_model()
    lost = [TraceEvent(1000.0, REMOVE, "n0"), TraceEvent(1000.0, REMOVE, "n1")]
    oob = simulate(Trace(name="t", events=[*steady(), *lost, TraceEvent(1010.0, ADD, "r0")], duration_s=2000.0),
                   strategy="oobleck", model=model,
                   params=SimParams(checkpoint_every_strategy=False, reconfigure_s=30.0, detection_s=5.0,
                                    node_ready_s=0.0))
    assert oob.breakdown["restarting"] == pytest.approx(35.0)
    rate = {n: model.total_microbatches / model.oobleck(n) for n in (4, 3)}
    assert oob.total_samples == pytest.approx(rate[4] * 1000.0 - 0.5 * model.total_microbatches + rate[3] * 965.0)

    joins = [TraceEvent(1050.0, ADD, "r0"), TraceEvent(1050.0, ADD, "r1")]
    ck = simulate(Trace(name="t", events=[*steady(), *lost, *joins], duration_s=2000.0), strategy="checkpoint",
                  model=model, params=SimParams(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0, restart_s=100.0,
                                                detection_s=5.0, node_ready_s=0.0))
    assert ck.breakdown["restarting"] == pytest.approx(105.0)
    assert oob.joiner_regroups == 0 and ck.joiner_regroups == 0  # no regroup of their own
    two = model.total_microbatches / model.full_pipelines(2)
    assert ck.total_samples == pytest.approx(two * (600.0 + 600.0 + 265.0))
