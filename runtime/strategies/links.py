"""What recycle's spill knows of the job's links, from the job's config alone.

Spill (`runtime.strategies.spill`) charges a host that takes on a stage it does not hold that
stage's gradient all-reduce (`LinkCosts.stage_join_times`), in seconds next to the compute it
saves. Every survivor plans alone and must reach the same plan, so the inputs are the config's, not
a measurement: the bandwidth it states (`JobConfig.link_gbps`), each layer's parameter bytes (the
built-in models' shapes, or a user's model's measures, `ModelSpec.layer_parameters`; float32
gradients, as the runtime reduces them) and each layer's device time (the emulated `device_time`,
else `layer_costs`, measured or the planner's, seconds of forward + backward per micro-batch split
evenly over F, I and W). The costs are a
`runtime.parallel.throughput.CostModel` (the model that prices the simulator's steps), so the
join's formula has one owner; the simulator, the planner and the benchmarks get the runtime's
placement by calling `layout_for` with the job's config.

No link costs (spill scores compute only, as before 2026-11-27) when the job states no bandwidth
(`link_gbps=0`), has no time scale to set traffic against (neither `device_time` nor
`layer_costs`), or runs a user's model that was not measured (no `model.layer_measures`: its shapes
are known only to its code).

What a job priced by a cost model states (`stated_by_cost_models`) is written here once: the
simulator's jobs (`runtime.sim.plans`) and the jobs the control plane plans itself
(`controlplane.planning.services._planned`) state the per-layer seconds and the bandwidth of the
cost model they were priced with, so a planned job on real instances (no `device_time`) gets
link-priced placement rather than compute only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from runtime.config import JobConfig
from runtime.parallel.schedule import stated_layer_times
from runtime.parallel.throughput import CostModel, Network
from runtime.strategies.spill import LinkCosts

GRADIENT_BYTES_PER_PARAMETER = 4
"""The runtime all-reduces float32 gradients (parameters and AdamW state stay float32)."""


def stated_by_cost_models(costs: Sequence[CostModel]) -> dict[str, float | list[float]]:
    """The config fields of a job priced with `costs`, one per instance type it may
    run on: each layer's forward + backward seconds per micro-batch (x `compute_scale`) as
    `layer_costs`, and the links' bandwidth as `link_gbps`.

    `layer_costs` also cuts the stages (`runtime.parallel.layout.pipelines_layout`), which is right
    here: the planner balanced (and checked the memory of) the stages it scored by these same
    per-layer seconds (`CostModel.bounds`), so the runtime runs the partition that was priced.
    Several types: each layer's slowest seconds and the smallest bandwidth, because a step (and each
    stage's ring all-reduce) goes at its slowest member's pace. Per-layer maxima keep stage cuts
    identical to one type's whenever every type is a uniform speed-up of the slowest."""
    if not costs:
        raise ValueError("no cost model to state; expected at least one")
    per_type = [[c * cost.compute_scale for c in cost.layer_costs()] for cost in costs]
    return {
        "layer_costs": [max(layer) for layer in zip(*per_type, strict=True)],
        "link_gbps": min(cost.network.bandwidth_gbps for cost in costs),
    }


def layer_times_s(config: JobConfig) -> list[tuple[float, float, float]] | None:
    """(F, I, W) seconds of each layer for one micro-batch, from what the job states (None: nothing)."""
    stated = stated_layer_times(config)
    if stated is None:
        return None
    times, unit_s = stated
    return [(f * unit_s, i * unit_s, w * unit_s) for f, i, w in times]


def link_costs(config: JobConfig) -> LinkCosts | None:
    """The job's link costs for spill's placement, or None where it states too little (see above)."""
    if not config.link_gbps > 0:
        return None
    times = layer_times_s(config)
    parameters = config.model.layer_parameters()
    if times is None or parameters is None or len(times) != len(parameters):
        return None
    return CostModel(
        fiw=times,
        output_bytes=[0.0] * len(times),  # activations are not priced: spill scores compute and joins
        param_bytes=[float(GRADIENT_BYTES_PER_PARAMETER * p) for p in parameters],
        network=Network(bandwidth_gbps=config.link_gbps),
        memory_bandwidth_gbs=math.inf,  # the update is the host's compute, which the job does not time
    )
