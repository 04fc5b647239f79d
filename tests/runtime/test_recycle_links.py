"""Recycle's spill priced with the job's own link costs (`JobConfig.link_gbps`, `runtime.strategies.links`):
same-stage peers where a stage's all-reduce outweighs the compute a spill saves, other stages' nodes
where compute dominates, the same plan on the runtime's plan path and in the simulator."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.config import DeviceTime, JobConfig, LayerMeasure, LayoutError, ModelSpec
from runtime.distributed.membership import plan_for_fleet
from runtime.parallel.layout import Layout
from runtime.parallel.throughput import CostModel, Network, allreduce_time
from runtime.sim.iteration import IterationModel
from runtime.strategies import get_strategy
from runtime.strategies.base import full_slots
from runtime.strategies.links import link_costs, stated_by_cost_models

pytestmark = pytest.mark.timeout(60)

WIDE_GPT = ModelSpec(kind="gpt", n_layer=6, n_embd=256, n_head=4, seq_len=16, vocab_size=64)
"""8 layers, about 0.8 M parameters (3.2 MB of float32 gradient) per block: 2 layers per stage at pp 4."""
LOST = 5  # stage 1 of pipeline 1 in a 2 x 4 job


def job(*, layer_ms: float, **kw) -> JobConfig:
    base = dict(model=WIDE_GPT, dp=2, pp=4, microbatches=4, global_batch=8, strategy="recycle", schedule="fiw",
                device_time=DeviceTime(forward_ms=layer_ms, backward_input_ms=layer_ms, backward_weight_ms=layer_ms))
    base.update(kw)
    return JobConfig(**base)


def lost_hop_hosts(config: JobConfig, layout: Layout) -> set[int]:
    """The nodes that run the lost node's stage for its pipeline's micro-batches."""
    stage = LOST % config.pp
    return {node for m, route in enumerate(layout.routes) if layout.pipeline_of[m] == LOST // config.pp
            for s, node in route if s == stage}


def plan(config: JobConfig) -> Layout:
    slots = [[None if n == LOST else n for n in row] for row in full_slots(config)]
    return get_strategy("recycle").layout_for(config, slots)


def test_layer_parameters_count_what_the_runtime_builds() -> None:
    import torch  # noqa: F401  (the count itself is torch-free; the check builds the layers)

    from runtime.models.model import build_layer

    for spec in (WIDE_GPT, ModelSpec(kind="mlp", n_layer=3, n_embd=24, in_features=7, vocab_size=5)):
        built = [sum(p.numel() for p in build_layer(spec, i, 0).parameters()) for i in range(spec.num_layers)]
        assert spec.layer_parameters() == built
    assert ModelSpec(kind="py", path="pkg.mod:fn", layers=3).layer_parameters() is None


def test_link_costs_price_a_join_as_the_stage_all_reduce_at_the_stated_bandwidth() -> None:
    config = job(layer_ms=2.0, link_gbps=4.0)
    costs = link_costs(config)
    assert costs is not None
    stages = ((0, 3), (3, 8))
    nbytes = 4.0 * sum(WIDE_GPT.layer_parameters()[3:8])
    joins = costs.stage_join_times(stages, {0: 2, 1: 1})
    assert joins[1] == pytest.approx(allreduce_time(nbytes, 2, Network(bandwidth_gbps=4.0)))
    assert costs.stage_compute(stages)[1] == pytest.approx((0.010, 0.010, 0.010))  # 5 layers x 2 ms
    # Nothing to price with: no bandwidth stated, no time scale, or a user's model never measured.
    assert link_costs(dataclasses.replace(config, link_gbps=0.0)) is None
    assert link_costs(dataclasses.replace(config, device_time=None)) is None
    measured = dataclasses.replace(config, device_time=None, layer_costs=[0.03] * 8)
    assert measured_costs(measured).fiw == [pytest.approx((0.01, 0.01, 0.01))] * 8
    user = dataclasses.replace(config, model=ModelSpec(kind="py", path="pkg.mod:fn", layers=8))
    assert link_costs(user) is None
    # Measured (`layer_measures`, as spotpipe submit records them), its parameters price the joins.
    measures = [LayerMeasure(parameters=100 * (i + 1), forward_flops=1.0, activation_bytes=1.0, output_bytes=1.0)
                for i in range(8)]
    measured_user = dataclasses.replace(user, model=ModelSpec(kind="py", path="pkg.mod:fn", layers=8,
                                                             layer_measures=measures))
    assert link_costs(measured_user).param_bytes == [400.0 * (i + 1) for i in range(8)]


def measured_costs(config: JobConfig) -> CostModel:
    costs = link_costs(config)
    assert isinstance(costs, CostModel)
    return costs


def test_a_job_priced_on_several_types_states_the_slowest_layers_and_the_smallest_bandwidth() -> None:
    # A step, and each stage's ring all-reduce, goes at its slowest member's pace.
    fast = CostModel(fiw=[(1.0, 1.0, 1.0), (1.0, 2.0, 3.0)], output_bytes=[0.0] * 2, param_bytes=[0.0] * 2,
                     network=Network(bandwidth_gbps=25.0))
    slow = CostModel(fiw=[(2.0, 2.0, 2.0), (1.0, 1.0, 1.0)], output_bytes=[0.0] * 2, param_bytes=[0.0] * 2,
                     network=Network(bandwidth_gbps=10.0), compute_scale=0.5)
    assert stated_by_cost_models([fast]) == {"layer_costs": fast.layer_costs(), "link_gbps": 25.0}
    assert stated_by_cost_models([fast, slow]) == {"layer_costs": [3.0, 6.0], "link_gbps": 10.0}
    with pytest.raises(ValueError):
        stated_by_cost_models([])


def test_link_gbps_is_validated() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(LayoutError) as info:
            job(layer_ms=2.0, link_gbps=bad).validate()
        assert info.value.field == "link_gbps"
    assert JobConfig.from_dict(job(layer_ms=2.0, link_gbps=25.0).to_dict()).link_gbps == 25.0


def test_traffic_dominates_lost_hops_stay_on_same_stage_peers() -> None:
    # A fast device (0.1 ms per layer and action) on a 1 Gbit/s link: the stage's all-reduce a new
    # host would join (tens of ms) outweighs any compute a spill saves.
    config = job(layer_ms=0.1, link_gbps=1.0)
    peers = {LOST % config.pp}  # slot column of the lost stage: node 1 is its only surviving peer
    assert {n % config.pp for n in lost_hop_hosts(config, plan(config))} == peers
    # The same job scored on compute only spills onto other stages' nodes.
    compute_only = dataclasses.replace(config, link_gbps=0.0)
    assert {n % config.pp for n in lost_hop_hosts(compute_only, plan(compute_only))} - peers


def test_compute_dominates_lost_hops_spill_onto_other_stages() -> None:
    # A slow device (50 ms per layer and action) on the same link: the lone peer would run 2 x 4
    # micro-batches of its stage, which costs far more than a few ms of all-reduce.
    config = job(layer_ms=50.0, link_gbps=10.0)
    layout = plan(config)
    assert {n % config.pp for n in lost_hop_hosts(config, layout)} - {LOST % config.pp}
    # Priced with the job's own costs, the spill is shorter than peers only.
    costs = measured_costs(config)
    peers = plan(dataclasses.replace(config, recycle_spill=False))
    assert costs.step_time(layout, schedule="fiw") < costs.step_time(peers, schedule="fiw")


@pytest.mark.parametrize("layer_ms,gbps", [(0.1, 1.0), (50.0, 10.0)])
def test_the_runtime_plan_path_places_with_the_jobs_link_costs(layer_ms: float, gbps: float) -> None:
    # What survivors and the control plane's reaction run after a loss (`make_plan` through
    # `plan_for_fleet`): the layout is the strategy's, priced with the config's link costs.
    config = job(layer_ms=layer_ms, link_gbps=gbps)
    answer = plan_for_fleet(config, full_slots(config), gone={LOST}, noticed=set())
    assert answer.layout == plan(config)


def test_the_simulator_plans_recycle_as_a_worker_of_the_job_would() -> None:
    # The simulator's config states its cost model's bandwidth and per-layer seconds, so its plan
    # is `get_strategy("recycle").layout_for` of that config (no cost-model path of its own), and
    # at 10 Gbit/s with a block of 50 MB one hole costs no more than peers only.
    spec = ModelSpec(kind="gpt", n_layer=8, n_embd=1024, n_head=8, seq_len=64, vocab_size=64)
    layers = spec.num_layers
    cost = CostModel(fiw=[(0.004, 0.004, 0.005)] * layers, output_bytes=[8e6] * layers,
                     param_bytes=[4.0 * p for p in spec.layer_parameters()])
    model = IterationModel(spec=spec, dp=4, pp=4, microbatches=4, cost=cost)
    config = model.plans.config("recycle", 4)
    assert config.link_gbps == cost.network.bandwidth_gbps and config.layer_costs == cost.layer_costs()
    pattern = ((True,) * 4, (True, False, True, True), (True,) * 4, (True,) * 4)
    slots = [[p * 4 + s if ok else None for s, ok in enumerate(row)] for p, row in enumerate(pattern)]
    assert model.plans.layout("recycle", pattern) == get_strategy("recycle").layout_for(config, slots)
    peers = IterationModel(spec=spec, dp=4, pp=4, microbatches=4, cost=cost, recycle_spill=False)
    assert model.step("recycle", pattern) <= peers.step("recycle", pattern) + 1e-9
    # Scored on compute only (the simulator's recycle row before the config stated the bandwidth),
    # the same hole costs more than peers only: the traffic is what the link costs add.
    compute_only = get_strategy("recycle").layout_for(dataclasses.replace(config, link_gbps=0.0), slots)
    assert model.plans.layout_step(compute_only, "fiw") > peers.step("recycle", pattern)


def test_spill_scores_the_schedule_the_nodes_build_in_the_jobs_own_unit() -> None:
    # The nodes build their action lists from the job's times in its own unit (`job_durations`: ms
    # of `device_time` here), and the list scheduler's ties depend on those very numbers. Spill once
    # scored placements on the same times in seconds, where float rounding ordered another schedule:
    # it picked a placement that runs 152 ms instead of 136 ms (`bench runtime`'s 1-of-8 layout).
    # Priced links (tiny joins for this small model) must not cost more than the joins themselves.
    from runtime.parallel.schedule import job_durations, schedule_length

    small = ModelSpec(kind="gpt", n_layer=6, n_embd=32, n_head=2, seq_len=16, vocab_size=64)
    config = job(layer_ms=4.0, model=small, global_batch=32)
    slots = [[0, 1, 2, 3], [4, None, 6, 7]]
    priced = get_strategy("recycle").layout_for(config, slots)
    compute_only = get_strategy("recycle").layout_for(dataclasses.replace(config, link_gbps=0.0), slots)
    step_ms = schedule_length(priced, "fiw", job_durations(config, priced))
    assert step_ms == schedule_length(compute_only, "fiw", job_durations(config, compute_only)) == 136.0
