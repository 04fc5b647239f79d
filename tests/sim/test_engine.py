"""Simulator invariants on a small job (2 pipelines x 2 stages) with fixed per-layer durations."""

from __future__ import annotations

import pytest

from runtime.config import ModelSpec
from runtime.parallel.throughput import CostModel
from runtime.sim.engine import STRATEGIES, SimParams, simulate
from runtime.sim.iteration import IterationModel
from runtime.sim.prices import PriceSeries
from runtime.traces import ADD, REMOVE, Trace, TraceEvent

SPEC = ModelSpec(kind="mlp", n_layer=2, n_embd=8)  # 4 layers


def make_model() -> IterationModel:
    layers = SPEC.num_layers
    cost = CostModel(fiw=[(0.01, 0.01, 0.01)] * layers, output_bytes=[0.0] * layers, param_bytes=[0.0] * layers)
    return IterationModel(spec=SPEC, dp=2, pp=2, microbatches=4, cost=cost)


def steady(hours: float = 2.0, nodes: int = 4) -> list[TraceEvent]:
    return [TraceEvent(0.0, ADD, f"n{i}") for i in range(nodes)]


def own_failure_free(model: IterationModel, strategy: str) -> float:
    step = {
        "checkpoint": model.full_pipelines(2),
        "oobleck": model.oobleck(4),
        "bamboo": model.bamboo((True, True), pipelines=2),
        "recycle": model.recycle((0, 0), pipelines=2),
    }[strategy]
    return model.total_microbatches / step


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "checkpoint"])
def test_no_failures_runs_at_the_strategy_failure_free_rate(strategy):
    model = make_model()
    trace = Trace(name="calm", events=steady(), duration_s=7200.0)
    result = simulate(trace, strategy=strategy, model=model)
    # Every strategy writes periodic checkpoints (the runtime does): it trains interval / (interval + C).
    interval, cost = result.checkpoint_interval_s, SimParams().checkpoint_cost_s
    duty = interval / (interval + cost)
    assert result.samples_per_s == pytest.approx(own_failure_free(model, strategy) * duty, rel=1e-9)
    assert result.lost_samples == 0
    bare = simulate(trace, strategy=strategy, model=model, params=SimParams(checkpoint_every_strategy=False))
    assert bare.samples_per_s == pytest.approx(own_failure_free(model, strategy), rel=1e-9)


def test_checkpoint_without_failures_pays_only_checkpoint_writes():
    model = make_model()
    trace = Trace(name="calm", events=steady(), duration_s=7200.0)
    params = SimParams(checkpoint_interval_s=600.0, checkpoint_cost_s=30.0)
    result = simulate(trace, strategy="checkpoint", model=model, params=params)
    rate = own_failure_free(model, "checkpoint")
    cycles = 7200.0 / 630.0
    full = int(cycles)
    compute = full * 600.0 + min(600.0, 7200.0 - full * 630.0)
    assert result.total_samples == pytest.approx(rate * compute, rel=1e-9)


def _with_extra_failures(base: list[TraceEvent], times: list[float]) -> list[TraceEvent]:
    extra = []
    for k, t in enumerate(times):
        extra += [TraceEvent(t, REMOVE, f"n{k % 4}"), TraceEvent(t + 300.0, ADD, f"r{k}")]
    return base + extra


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_more_failures_never_faster(strategy):
    model = make_model()
    calm = Trace(name="calm", events=steady(), duration_s=7200.0)
    one = Trace(name="one", events=_with_extra_failures(steady(), [1000.0]), duration_s=7200.0)
    three = Trace(name="three", events=_with_extra_failures(steady(), [1000.0, 3000.0, 5000.0]), duration_s=7200.0)
    samples = [simulate(t, strategy=strategy, model=model).total_samples for t in (calm, one, three)]
    assert samples[0] >= samples[1] >= samples[2]
    assert samples[0] > samples[2]


def test_dollars_are_node_hours_times_price_and_on_demand_baseline():
    model = make_model()
    events = [*steady(), TraceEvent(3600.0, REMOVE, "n0")]
    trace = Trace(name="t", events=events, duration_s=7200.0)
    params = SimParams(spot_price=PriceSeries.constant(0.5), on_demand_usd_per_hour=2.0)
    result = simulate(trace, strategy="recycle", model=model, params=params)
    assert result.dollars == pytest.approx((4 + 3) * 0.5)
    # On-demand: 4 nodes at $2/h at the failure-free rate.
    assert result.on_demand_dollars_per_sample == pytest.approx(4 * 2.0 / 3600 / result.failure_free_samples_per_s)


def test_price_series_integrates_piecewise():
    prices = PriceSeries.from_points([(0.0, 1.0), (1800.0, 3.0)])
    assert prices.cost_of_nodes([(0.0, 2)], 3600.0) == pytest.approx(2 * (0.5 * 1.0 + 0.5 * 3.0))


def test_notice_longer_than_a_step_loses_no_work():
    model = make_model()
    events = _with_extra_failures(steady(), [1000.0])
    trace = Trace(name="t", events=events, duration_s=7200.0)
    blind = simulate(trace, strategy="oobleck", model=model, params=SimParams(notice_s=0.0))
    warned = simulate(trace, strategy="oobleck", model=model, params=SimParams(notice_s=120.0))
    assert blind.lost_samples > 0
    assert warned.lost_samples == 0
    assert warned.total_samples > blind.total_samples


def test_unknown_strategy_is_named():
    model = make_model()
    with pytest.raises(ValueError, match="strategy 'nope'"):
        simulate(Trace(name="t", events=steady(), duration_s=10.0), strategy="nope", model=model)


def test_time_to_finish_a_target():
    model = make_model()
    trace = Trace(name="calm", events=steady(), duration_s=7200.0)
    rate = own_failure_free(model, "oobleck")
    params = SimParams(checkpoint_every_strategy=False)
    done = simulate(trace, strategy="oobleck", model=model, params=params, samples_target=rate * 1800.0)
    assert done.finish_s == pytest.approx(1800.0)
    assert done.summary()["time_to_finish_hours"] == pytest.approx(0.5)
    never = simulate(trace, strategy="oobleck", model=model, params=params, samples_target=rate * 9000.0)
    assert never.finish_s is None


def test_price_history_loader_on_the_real_file(shared_data):
    from runtime.sim.prices import load_price_series

    path = shared_data / "prices" / "aws-spot-prices-2022-05.tsv.gz"
    series, meta = load_price_series(path, instance_type="p3.2xlarge", zone="use1-az6")
    assert meta["zone"] == "use1-az6" and meta["changes"] >= 1
    assert series.at(0.0) == pytest.approx(0.918)
    picked, meta = load_price_series(path, instance_type="g4dn.xlarge")
    assert meta["changes"] >= 1 and picked.at(0.0) > 0
    with pytest.raises(ValueError, match=r"no Linux/UNIX prices for nope\.large"):
        load_price_series(path, instance_type="nope.large")


def test_strategies_that_survive_losses_checkpoint_at_the_runtimes_interval():
    """The runtime counts a loss as a failure only when it needed the checkpoint (a layout
    survived: no), so recycle's interval comes from its MTBF prior however often nodes go;
    checkpoint-restart's from the trace's whole-fleet rate."""
    model = make_model()
    # One node of four goes and comes back every 10 minutes: a busy fleet, but recycle keeps a layout.
    events = steady()
    for k in range(1, 12):
        events += [TraceEvent(600.0 * k, REMOVE, "n1"), TraceEvent(600.0 * k + 60.0, ADD, "n1")]
    trace = Trace(name="churn", events=events, duration_s=7200.0)
    cost = SimParams().checkpoint_cost_s
    result = simulate(trace, strategy="recycle", model=model, params=SimParams(mtbf_prior_s=3600.0))
    assert result.checkpoint_interval_s == pytest.approx((2 * cost * 3600.0) ** 0.5)
    assert result.restores == 0
    # A smaller prior means more frequent checkpoints, so less training in the same trace.
    busier = simulate(trace, strategy="recycle", model=model, params=SimParams(mtbf_prior_s=600.0))
    assert busier.total_samples < result.total_samples
    # Checkpoint-restart does not read the prior: it restarts on every loss.
    ckpt = [simulate(trace, strategy="checkpoint", model=model, params=SimParams(mtbf_prior_s=p)).total_samples
            for p in (600.0, 3600.0)]
    assert ckpt[0] == ckpt[1]
