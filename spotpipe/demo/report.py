"""What the demo prints at the end: the job's cost report (billing's own report, segment by
segment) and the simulator's comparison of the job's strategy with checkpoint-restart on the same
preemption trace, at a realistic scale."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from controlplane.billing.reports import CostReport
from runtime.traces import Trace

# The simulated job: the demo's layout (dp x pp) for a GPT worth renting GPUs for, on the type the
# local nodes stand in for. The demo's own 4-layer GPT on CPU would say nothing about GPUs.
SIM_MODEL = {"kind": "gpt", "n_layer": 24, "n_embd": 1024, "n_head": 16, "seq_len": 512, "vocab_size": 8192}
SIM_MICROBATCHES = 8
SIM_MICROBATCH_SIZE = 4


def _usd(value: Decimal, places: str = "0.000001") -> str:
    return f"${value.quantize(Decimal(places))}"


def cost_lines(report: CostReport) -> list[str]:
    """The cost report as text: totals, then one line per billing segment and the check that the
    total is their sum."""
    data = report.to_dict()
    lines = [
        f"Cost report of job {report.job_id} ({report.job_name}), as of {report.as_of:%H:%M:%S} UTC",
        f"  spot total            {_usd(report.total)}  over {data['billed_hours']} node-hours",
        f"  on-demand equivalent  {_usd(report.on_demand_equivalent)}  "
        f"(savings {_usd(report.savings)}, {data['savings_pct'] or '-'} %)",
        f"  preemptions           {report.preemption_events} reconfiguration(s) that lost time, "
        f"{report.preemption_lost_seconds:.1f} s lost, {_usd(report.preemption_loss)}",
        "  segments:",
    ]
    for segment in report.segments:
        end = f"{segment.end:%H:%M:%S}" if segment.end else "open"
        lines.append(
            f"    instance {segment.instance_id:<4} {segment.provider_instance_id:<22} {segment.instance_type:<11} "
            f"{segment.start:%H:%M:%S}-{end:<8} {segment.hours.quantize(Decimal('0.00001'))} h x "
            f"${segment.price_per_hour}/h ({segment.price_source}) = {_usd(segment.cost)}")
    total = sum((s.cost for s in report.segments), Decimal(0))
    lines.append(f"  sum of the {len(report.segments)} segments = {_usd(total)} "
                 f"({'equals' if total == report.total else 'DIFFERS FROM'} the report's total)")
    return lines


@dataclass(frozen=True, slots=True)
class Comparison:
    """Simulated figures of one strategy on the trace."""

    strategy: str
    summary: dict[str, Any]


def simulate_comparison(trace: Trace, *, strategy: str, dp: int, pp: int, instance_type: str,
                        spot_usd_per_hour: float, on_demand_usd_per_hour: float) -> list[Comparison]:
    """Replay `trace` for `strategy` and for checkpoint-restart (Young/Daly interval) with the
    runtime's own schedules (`runtime.sim`), the GPT above profiled for `instance_type` by the
    planner's predictor, and the market's price for it."""
    from runtime.config import ModelSpec
    from runtime.parallel.throughput import CostModel, Network
    from runtime.planner.catalog import instance_types
    from runtime.planner.predictor import default_predictor
    from runtime.planner.profile import DeviceSpec
    from runtime.sim.engine import SimParams, checkpoint_write_s, simulate
    from runtime.sim.iteration import IterationModel
    from runtime.sim.prices import PriceSeries

    spec = instance_types()[instance_type]
    device = DeviceSpec(name=spec.name, peak_tflops=spec.peak_tflops, memory_bandwidth_gbs=spec.memory_bandwidth_gbs,
                        network_gbps=spec.network_gbps)
    model = ModelSpec(**SIM_MODEL)
    profile = default_predictor().predict(model, microbatch_size=SIM_MICROBATCH_SIZE, device=device,
                                          instance_type=spec.name)
    cost = CostModel.from_profile(profile, network=Network(bandwidth_gbps=spec.network_gbps or 10.0))
    iterations = IterationModel(spec=model, dp=dp, pp=pp, microbatches=SIM_MICROBATCHES, cost=cost)
    params = SimParams(checkpoint_cost_s=checkpoint_write_s(sum(cost.param_bytes), writers=pp),
                       spot_price=PriceSeries.constant(spot_usd_per_hour),
                       on_demand_usd_per_hour=on_demand_usd_per_hour)
    out = []
    for name in dict.fromkeys([strategy, "checkpoint"]):
        result = simulate(trace, strategy=name, model=iterations, params=params,
                          samples_per_microbatch=SIM_MICROBATCH_SIZE)
        out.append(Comparison(strategy=name, summary=result.summary()))
    return out


def comparison_lines(comparisons: list[Comparison], *, trace: Trace, dp: int, pp: int, instance_type: str) -> list[str]:
    summary = trace.summary()
    lines = [
        f"Simulator: the same trace ({trace.name}: {summary['duration_hours']:.1f} h, "
        f"{summary['preemptions']} preemptions in {summary['preemption_events']} events), "
        f"a GPT {SIM_MODEL['n_layer']}x{SIM_MODEL['n_embd']} on {dp}x{pp} {instance_type}, no notices:",
        f"  {'strategy':<11} {'throughput vs failure-free':>27} {'paused h':>9} {'cost/sample vs on-demand':>25}",
    ]
    for c in comparisons:
        s = c.summary
        lines.append(f"  {c.strategy:<11} {s['throughput_relative_to_failure_free']:>27.3f} {s['paused_hours']:>9.2f} "
                     f"{s['cost_per_sample_relative_to_on_demand']:>25.3f}")
    if len(comparisons) == 2:
        a, b = comparisons
        ratio = a.summary["samples_per_s"] / b.summary["samples_per_s"] if b.summary["samples_per_s"] else float("inf")
        lines.append(f"  {a.strategy} trains {ratio:.2f}x as fast as checkpoint-restart on this trace")
    return lines
