"""Any trace, any fleet size: fleets that lose every node and come back, in every trace format and
at 4, 16, 32 and 80 nodes, under every strategy; and the plan cache against uncached plans."""

from __future__ import annotations

import json
import math
import random

import pytest

from runtime.config import LayoutError, ModelSpec
from runtime.parallel.throughput import CostModel
from runtime.sim.engine import STRATEGIES, SimParams, simulate
from runtime.sim.iteration import IterationModel
from runtime.sim.plans import PlanSteps, schedule_of
from runtime.sim.synthetic import synthetic_trace
from runtime.traces import ADD, REMOVE, Trace, TraceEvent, load_trace

SPEC = ModelSpec(kind="mlp", n_layer=6, n_embd=8)  # 8 layers: up to pp = 8


def make_model(dp: int, pp: int) -> IterationModel:
    layers = SPEC.num_layers
    cost = CostModel(
        fiw=[(0.01, 0.01, 0.01)] * layers, output_bytes=[1e5] * layers, param_bytes=[1e6] * layers
    )
    return IterationModel(spec=SPEC, dp=dp, pp=pp, microbatches=pp, cost=cost)


def job_shape(nodes: int) -> tuple[int, int]:
    """The benchmark's shape: pipelines of 8 stages from 16 nodes, else half the fleet deep."""
    pp = 8 if nodes >= 16 else max(1, nodes // 2)
    return max(1, nodes // pp), pp


def to_zero_and_back(nodes: int, *, hours: float = 3.0, seed: int = 0) -> Trace:
    """A synthetic trace whose whole fleet is reclaimed at 1 h and granted again from 1.5 h."""
    # About a dozen preemptions whatever the size: enough states, few plans of big fleets.
    base = synthetic_trace(nodes=nodes, hours=hours, rate_per_node_hour=0.3 * min(1.0, 16 / nodes), mean_burst=2.0,
                           replacement_delay_s=600, seed=seed)
    live: set[str] = set()
    events = []
    for e in base.events:
        if 3600 <= e.t_s < 5400:
            continue
        events.append(e)
    for e in sorted(base.events, key=lambda e: (e.t_s, e.kind != REMOVE)):
        if e.t_s >= 3600:
            break
        (live.add if e.kind == ADD else live.discard)(e.node)
    events += [TraceEvent(3600.0, REMOVE, n) for n in sorted(live)]
    events += [TraceEvent(5400.0, ADD, f"back{i}") for i in range(nodes)]
    # Nodes removed later in the base trace that were reclaimed at 1 h are gone already (ignored).
    return Trace(name=f"zero-{nodes}", events=events, duration_s=hours * 3600)


def check(result, trace: Trace, model: IterationModel) -> None:
    """Finite, positive, and never faster than the strategy's own failure-free rate (which may beat
    the 1F1B baseline: recycle runs F-I-W)."""
    s = result.summary()
    assert math.isfinite(result.total_samples) and result.total_samples > 0
    own = model.oobleck(model.dp * model.pp) if result.strategy == "oobleck" else (
        model.step(result.strategy, model.full(model.dp))
    )
    assert result.samples_per_s <= model.total_microbatches / own * (1 + 1e-9)
    assert s["hours_without_a_plan"] <= trace.duration_s / 3600


@pytest.mark.parametrize("nodes", [4, 16, 32, 80])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fleet_lost_and_back_at_every_size(nodes, strategy):
    trace = to_zero_and_back(nodes)
    dp, pp = job_shape(nodes)
    model = make_model(dp, pp)
    result = simulate(trace, strategy=strategy, model=model, params=SimParams(checkpoint_cost_s=1.0))
    check(result, trace, model)
    s = result.summary()
    # The fleet was gone for 30 min: the job waited without a plan, then resumed from its checkpoint.
    assert s["hours_without_a_plan"] >= 0.5 - 1e-9
    assert s["restores_from_checkpoint"] >= 1
    after = [c for t, c in result.series if t > 5400 + 3600]
    assert after and after[-1] > max(c for t, c in result.series if t <= 5400), "no progress after the fleet came back"


def _write_formats(tmp_path, nodes: int = 4) -> list:
    """The same zero-and-back fleet in the three file formats `load_trace` reads."""
    bamboo = tmp_path / "fleet.csv"
    lines = [f"0,add,node{i}" for i in range(nodes)]
    lines += [f"1800000,remove,node{i}" for i in range(nodes)]
    lines += [f"3600000,add,node{nodes + i}" for i in range(nodes)]
    lines += [f"10800000,remove,node{nodes}"]
    bamboo.write_text("\n".join(lines) + "\n")
    gcp = tmp_path / "fleet.txt"
    gcp.write_text(
        "2024-01-01, 00:00:00, 4\n2024-01-01, 00:30:00, 0\n2024-01-01, 01:00:00, 4\n2024-01-01, 03:00:00, 3\n"
    )
    sky = tmp_path / "fleet.json"
    ticks = [0] * 30 + [1] * 30 + [0] * 120  # 1 = preempted; one-minute ticks, 3 h
    sky.write_text(json.dumps({"metadata": {"gap_seconds": 60, "format": "preemption-ticks"}, "data": ticks}))
    return [bamboo, gcp, sky]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_trace_format_goes_to_zero_and_back(tmp_path, strategy):
    for path in _write_formats(tmp_path):
        trace = load_trace(path)
        nodes = trace.max_nodes()
        dp, pp = job_shape(nodes)
        model = make_model(dp, pp)
        result = simulate(trace, strategy=strategy, model=model, params=SimParams(checkpoint_cost_s=1.0))
        check(result, trace, model)
        assert result.summary()["hours_without_a_plan"] >= 0.5 - 1e-9, path.name
        assert result.restores >= 1, path.name


@pytest.mark.parametrize("name", ["aws-p3.2xlarge-bamboo.csv", "aws-g4dn-bamboo.csv", "gcp-a100-east1b-bamboo.txt",
                                  "aws-v100-1node-us-east-1c-skypilot.json"])
def test_real_traces_run_under_every_strategy(shared_data, name):
    # The SkyPilot file does not say what its ticks mean: Can't Be Late's collection, 1 = preempted.
    trace = load_trace(shared_data / "traces" / name, format="preemption-ticks" if name.endswith(".json") else None)
    dp, pp = job_shape(trace.max_nodes())
    model = make_model(dp, pp)
    emptied = any(n == 0 for t, n in trace.node_count_series() if t > 0)
    for strategy in STRATEGIES:
        result = simulate(trace, strategy=strategy, model=model)
        check(result, trace, model)
        if emptied:  # the 1-node SkyPilot trace: every preemption empties the fleet
            assert result.restores >= 1 and result.down_s > 0, strategy


def _random_pattern(rng: random.Random, dp: int, pp: int, dead: int) -> tuple[tuple[bool, ...], ...]:
    slots = [[True] * pp for _ in range(dp)]
    for n in rng.sample(range(dp * pp), dead):
        slots[n // pp][n % pp] = False
    return tuple(tuple(r) for r in slots)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cached_plan_lengths_equal_uncached(strategy):
    """A state's step from the caches (canonical state, shared groups) equals the step of the
    runtime's plan for that very slot grid computed from scratch."""
    rng = random.Random(7)
    for dp, pp in ((2, 2), (3, 4), (4, 4), (6, 2)):
        model = make_model(dp, pp)
        cached = model.plans
        for _ in range(6):
            pattern = _random_pattern(rng, dp, pp, rng.randint(0, dp * pp // 2))
            fresh = PlanSteps(spec=SPEC, pp=pp, total_microbatches=model.total_microbatches, cost=model.cost)
            try:
                layout = fresh.layout(strategy, pattern)
            except LayoutError:  # no plan: the cache must say so too
                assert cached.step(strategy, pattern) == math.inf
                continue
            want = fresh.layout_step(layout, schedule_of(strategy))
            assert cached.step(strategy, pattern) == pytest.approx(want, rel=1e-12), (dp, pp, pattern)
            assert cached.step(strategy, pattern) == pytest.approx(want, rel=1e-12)  # and again, from the cache


@pytest.mark.parametrize(("strategy", "tolerance"), [("checkpoint", 1e-9), ("oobleck", 1e-9), ("bamboo", 5e-3)])
def test_grouped_step_equals_whole_replay(strategy, tolerance):
    """Where every node owns one layer run, the longest group's step is the whole layout's step;
    bamboo's replicas own a second run, whose all-reduce can wait on another group: a lower bound."""
    rng = random.Random(3)
    model = make_model(4, 4)
    for _ in range(8):
        pattern = _random_pattern(rng, 4, 4, rng.randint(0, 4))
        whole = model.plans.exact_step(strategy, pattern)
        if whole == math.inf:
            continue
        grouped = model.plans.layout_step(model.plans.layout(strategy, pattern), schedule_of(strategy))
        assert grouped == pytest.approx(whole, rel=tolerance)
        assert grouped <= whole * (1 + 1e-9)


def test_planning_a_state_leaves_the_garbage_collector_as_it_was() -> None:
    import gc

    model = make_model(4, 4)
    pattern = ((True,) * 4, (True, False, True, True), (True,) * 4, (True,) * 4)
    assert gc.isenabled()
    step = model.plans.step("recycle", pattern)
    assert gc.isenabled() and math.isfinite(step) and step > 0
    gc.disable()
    try:
        assert model.plans.step("bamboo", pattern) > 0
        assert not gc.isenabled()
    finally:
        gc.enable()
