"""Fleet simulation of every strategy under a preemption trace, against the published relations.

`python -m bench simulate [--trace PATH] [--quick]` replays the trace (default: a synthetic trace
calibrated on the AWS p3 cluster) for checkpoint-restart (Young/Daly interval), bamboo, oobleck and
recycle, with step times replayed from the runtime's own schedules and a GPT profile predicted for
p3.2xlarge, and prints per strategy the throughput relative to failure-free, the cost per sample
relative to on-demand and where the wall time went (training, redone, checkpointing, restarting,
waiting), plus recycle as published (`recycle-peers`). Then it times a 1,000-node, 24-hour run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import _simulate_scale as scale_section
from bench.report import Progress, print_table
from runtime.config import ModelSpec
from runtime.parallel.throughput import CostModel, Network
from runtime.planner.catalog import instance_types
from runtime.planner.predictor import default_predictor
from runtime.planner.profile import DeviceSpec
from runtime.sim.engine import (
    STORAGE_GBPS,
    STRATEGIES,
    TIME_BUCKETS,
    SimParams,
    SimResult,
    checkpoint_write_s,
    simulate,
)
from runtime.sim.iteration import IterationModel
from runtime.sim.plots import write_plots
from runtime.sim.prices import PriceSeries, load_price_series
from runtime.sim.synthetic import synthetic_trace
from runtime.traces import FORMATS, Trace, load_trace

PUBLISHED = [
    # (numerator, denominator, published ratio of throughput, source)
    ("bamboo", "checkpoint", 3.7, "Bamboo (NSDI'23): 3.7x the throughput of checkpoint-restart on the p3 trace"),
    ("recycle", "oobleck", 1.46, "ReCycle (SOSP'24): up to 1.46x Oobleck"),
    ("recycle", "bamboo", 1.64, "ReCycle (SOSP'24): up to 1.64x Bamboo"),
    ("recycle-peers", "oobleck", 1.46, "ReCycle (SOSP'24): up to 1.46x Oobleck (recycle as published: peers only)"),
    ("recycle-peers", "bamboo", 1.64, "ReCycle (SOSP'24): up to 1.64x Bamboo (recycle as published: peers only)"),
]
PEERS = "recycle-peers"
"""The extra row: recycle as ReCycle publishes it (`JobConfig.recycle_spill=False`: a lost hop goes
to same-stage peers only), beside the runtime's default (spill) under the name recycle."""
MODEL = ModelSpec(kind="gpt", n_layer=24, n_embd=1024, n_head=16, seq_len=512, vocab_size=8192)
OUT_DIR = Path("var/bench/simulate")


def parse_args(extra: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench simulate")
    parser.add_argument("--trace", type=Path, help="a Bamboo CSV, GCP counts or SkyPilot JSON trace")
    parser.add_argument("--trace-format", choices=tuple(FORMATS), default=None,
                        help="how to read --trace (runtime.traces.FORMATS; default: named in the file or by "
                             "its line syntax; JSON ticks must be named)")
    parser.add_argument("--instance-type", default="p3.2xlarge", help="type whose profile and prices are used")
    parser.add_argument("--notice-s", type=float, default=0.0, help="preemption notice lead time")
    parser.add_argument("--replacement-delay-s", type=float, default=0.0, help="extra delay for every join")
    parser.add_argument("--restart-s", type=float, help="checkpoint restart (default: rendezvous + reload)")
    parser.add_argument("--prices", type=Path, help="spot price history TSV(.gz) (describe_spot_price_history fields)")
    parser.add_argument("--zone", help="zone ID of the price history (default: the zone with most changes)")
    parser.add_argument("--join-batch-wait-s", type=float,
                        help="checkpoint/oobleck: longest wait of a joiner for a batch worth a regroup "
                             "(default: JobConfig.join_batch_wait_s; 0: every joiner at once)")
    synthetic = parser.add_argument_group("synthetic trace (used when no --trace is given)")
    synthetic.add_argument("--nodes", type=int, default=32)
    synthetic.add_argument("--hours", type=float, default=11.4)
    synthetic.add_argument("--rate", type=float, default=0.61, help="preemptions per node-hour")
    synthetic.add_argument("--burst", type=float, default=2.1, help="mean nodes per preemption event")
    synthetic.add_argument("--synthetic-replacement-delay-s", type=float, default=600.0)
    synthetic.add_argument("--seed", type=int, default=0)
    return vars(parser.parse_args(extra))


def iteration_model(instance_type: str, *, dp: int, pp: int, microbatches: int) -> IterationModel:
    """GPT profile predicted for `instance_type` by the learned predictor (shipped coefficients)."""
    it = instance_types()[instance_type]
    device = DeviceSpec(
        name=it.name,
        peak_tflops=it.peak_tflops,
        memory_bandwidth_gbs=it.memory_bandwidth_gbs,
        network_gbps=it.network_gbps,
    )
    profile = default_predictor().predict(MODEL, microbatch_size=4, device=device, instance_type=it.name)
    cost = CostModel.from_profile(profile, network=Network(bandwidth_gbps=it.network_gbps or 10.0))
    return IterationModel(spec=MODEL, dp=dp, pp=pp, microbatches=microbatches, cost=cost)


def run_all(trace: Trace, model: IterationModel, params: SimParams, peers: IterationModel | None = None) -> dict:
    """Every strategy on the trace (and, given `peers`, recycle as published: `PEERS`); the target
    (for time to finish) is half of what the failure-free job would train over the whole trace."""
    samples_per_step = model.total_microbatches * 4
    target = 0.5 * trace.duration_s * samples_per_step / model.full_pipelines(model.dp)
    runs = [(s, s, model) for s in STRATEGIES] + ([(PEERS, "recycle", peers)] if peers is not None else [])
    results = {}
    for name, s, m in runs:
        results[name] = simulate(trace, strategy=s, model=m, params=params, samples_per_microbatch=4,
                                 samples_target=target)
        results[name].strategy = name
    return results


def run(
    *,
    quick: bool,
    progress: Progress,
    trace: Path | None = None,
    trace_format: str | None = None,
    instance_type: str = "p3.2xlarge",
    notice_s: float = 0.0,
    replacement_delay_s: float = 0.0,
    restart_s: float | None = None,
    join_batch_wait_s: float | None = None,
    prices: Path | None = None,
    zone: str | None = None,
    nodes: int = 32,
    hours: float = 11.4,
    rate: float = 0.61,
    burst: float = 2.1,
    synthetic_replacement_delay_s: float = 600.0,
    seed: int = 0,
) -> dict:
    it = instance_types()[instance_type]
    spot = it.typical_spot_usd_per_hour
    price_series = PriceSeries.constant(spot)
    price_source: dict = {"kind": "advisor typical savings", "usd_per_hour": round(spot, 4)}
    if prices is not None:
        price_series, price_source = load_price_series(prices, instance_type=instance_type, zone=zone)
        price_source["kind"] = f"history from {prices.name}"
    if trace is not None:
        progress.step(f"loading {trace}")
        tr = load_trace(trace, format=trace_format)
    else:
        tr = synthetic_trace(
            nodes=nodes,
            hours=hours,
            rate_per_node_hour=rate,
            mean_burst=burst,
            replacement_delay_s=synthetic_replacement_delay_s,
            seed=seed,
        )
    summary = tr.summary()
    max_nodes = max(summary["max_nodes"], 1)
    pp = 8 if max_nodes >= 16 else max(1, max_nodes // 2)
    dp = max(1, max_nodes // pp)
    model = iteration_model(instance_type, dp=dp, pp=pp, microbatches=8)
    peers = IterationModel(spec=MODEL, dp=dp, pp=pp, microbatches=8, cost=model.cost, recycle_spill=False)
    params = SimParams(
        checkpoint_cost_s=checkpoint_write_s(sum(model.cost.param_bytes), writers=pp),
        restart_s=restart_s,
        **({} if join_batch_wait_s is None else {"join_batch_wait_s": join_batch_wait_s}),
        notice_s=notice_s,
        replacement_delay_s=replacement_delay_s,
        spot_price=price_series,
        on_demand_usd_per_hour=it.on_demand_usd_per_hour,
    )
    # The 1,000-node runs need only the cost model (the same profile: same model, same instance
    # type) and these parameters: they start now, in worker processes, beside everything below.
    scale_runs = scale_section.start(MODEL, model.cost, params, ("bamboo",) if quick else STRATEGIES)
    progress.step(f"simulating {tr.name}: {dp} x {pp} nodes, 4 strategies and recycle as published")
    started, cpu = time.perf_counter(), time.process_time()
    results = run_all(tr, model, params, peers)
    sim_s, sim_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    figures: dict = {
        "trace": summary,
        "job": {
            "model": "gpt 24 x 1024, seq 512, micro-batch 4",
            "instance_type": instance_type,
            "dp": dp,
            "pp": pp,
            "microbatches_per_pipeline": 8,
            "spot_price": price_source,
            "on_demand_usd_per_hour": it.on_demand_usd_per_hour,
            "failure_free_step_s": model.full_pipelines(dp),
            "bamboo_failure_free_step_s": model.bamboo((True,) * pp, pipelines=dp),
            "recycle_failure_free_step_s": model.recycle((0,) * pp, pipelines=dp),
        },
        "checkpoint_model": {
            "checkpoint_write_s": params.checkpoint_cost_s,
            "how": "3 x parameter bytes (weights + AdamW moments) / pp writers / storage bandwidth",
            "storage_gbps": STORAGE_GBPS,
            "rendezvous_s": params.rendezvous_s,
            "restart_s": params.restart_total_s,
            "node_ready_s": params.node_ready_s,
            "checkpoint_every_strategy": params.checkpoint_every_strategy,
        },
        "params": {k: v for k, v in _params_kwargs(params).items() if k != "spot_price"},
        "simulation_seconds": round(sim_s, 3),
        "simulation_cpu_seconds": round(sim_cpu_s, 3),
        "states_planned": model.plans.planned,
        "strategies": {s: r.summary() for s, r in results.items()},
    }
    rows = []
    baseline = results["checkpoint"].samples_per_s
    for s, r in results.items():
        d = r.summary()
        rows.append(
            [
                s,
                d["throughput_relative_to_failure_free"],
                r.samples_per_s / baseline if baseline else float("inf"),
                d["cost_per_sample_relative_to_on_demand"],
                d["total_samples"],
                d["dollars"],
                d["paused_hours"],
                d["restores_from_checkpoint"],
                d["hours_without_a_plan"],
                "not reached" if d["time_to_finish_hours"] is None else d["time_to_finish_hours"],
            ]
        )
        figures["strategies"][s]["throughput_relative_to_checkpoint_restart"] = rows[-1][2]
    print_table(
        f"{tr.name}: {summary['preemptions']} preemptions, {summary['preemptions_per_node_hour']:.2f}/node-hour, "
        f"{dp} x {pp} nodes of {instance_type} (simulated in {sim_s:.2f} s wall, {sim_cpu_s:.2f} s CPU). "
        "Baselines: failure-free = the plain "
        f"dp x pp 1F1B job on all {dp * pp} nodes, no preemption; checkpoint-restart = its row; on-demand = the "
        "failure-free job at the on-demand price",
        [
            "strategy",
            "throughput / failure-free",
            "throughput / checkpoint-restart",
            "cost per sample / on-demand",
            "samples",
            "dollars",
            "paused h",
            "restores",
            "h without a plan",
            "h to finish target",
        ],
        rows,
    )
    _breakdown_table(results, tr.name)
    figures["relations"] = _relations(results, f"published relations (throughput ratios), notice {notice_s:g} s")
    figures["why"] = _explain(model, peers, dp, pp)
    figures["notes"] = _notes(figures["relations"], figures["why"], model, dp, params, results["checkpoint"])
    for note in figures["notes"]:
        print(f"note: {note}")

    # With the 2-minute AWS notice, a leaving node finishes its step and nobody waits for detection.
    if not quick and notice_s < 120:
        warned_params = SimParams(**{**_params_kwargs(params), "notice_s": 120.0})
        warned = run_all(tr, model, warned_params)
        print_table(
            f"{tr.name} with a 120 s notice",
            ["strategy", "throughput / failure-free (same baseline as above)", "cost per sample / on-demand"],
            [
                [
                    s,
                    r.summary()["throughput_relative_to_failure_free"],
                    r.summary()["cost_per_sample_relative_to_on_demand"],
                ]
                for s, r in warned.items()
            ],
        )
        figures["with_120s_notice"] = {s: r.summary() for s, r in warned.items()}
        figures["relations_with_120s_notice"] = _relations(warned, "published relations with a 120 s notice")

    # What drives bamboo vs checkpoint: the restart cost of checkpoint-restart.
    if not quick:
        bamboo_rate = results["bamboo"].samples_per_s  # no restart time changes it
        sens = []
        for restart in (params.restart_total_s, 120.0, 300.0, 600.0):
            ck_rate = checkpoint_rate_with_restart(tr, model, params, restart)
            sens.append({"restart_s": restart, "bamboo_over_checkpoint": bamboo_rate / ck_rate})
        print_table(
            "bamboo throughput / checkpoint-restart throughput vs the restart time (first row: the model's)",
            ["restart s", "bamboo / checkpoint-restart"],
            [[r["restart_s"], r["bamboo_over_checkpoint"]] for r in sens],
        )
        figures["bamboo_over_checkpoint_by_restart_s"] = sens
        # The restart the published ratio implies on this trace: what the author's decision needs.
        needed = {f"{t:g}": restart_for_ratio(tr, model, params, bamboo_rate, t) for t in BAMBOO_RATIOS_ASKED}
        print_table(
            "checkpoint-restart restart time at which bamboo's throughput reaches a ratio (bisection to 1 s; "
            f"'-': not reached by {RESTART_SEARCH_MAX_S:,.0f} s)",
            ["bamboo / checkpoint-restart", "restart s needed", "x the model's restart"],
            [[f"{t}x", v if v is not None else "-",
              round(v / params.restart_total_s, 1) if v is not None else "-"] for t, v in needed.items()],
        )
        figures["restart_s_for_bamboo_over_checkpoint"] = needed

    progress.step("writing plots")
    figures["plots"] = write_plots(list(results.values()), OUT_DIR, title=f"{tr.name}: {dp} x {pp} {instance_type}")
    for kind, path in figures["plots"].items():
        print(f"{kind}: {path}")

    # Scale: 1,000 nodes for 24 simulated hours (started above).
    workers = f"{scale_runs.workers} worker process{'es' if scale_runs.workers > 1 else ''}"
    progress.step(f"1,000-node, 24-hour runs ({workers}, started before the p3 runs)")
    scale_rows, scale = [], {}
    with scale_runs.pool:
        for s, future in scale_runs.futures.items():
            scale[s] = future.result()
            progress.step(f"1,000 nodes: {s} in {scale[s]['wall_seconds']:.1f} s")
            scale_rows.append([s, *(scale[s][k] for k in ("simulated_hours", "wall_seconds", "cpu_seconds",
                                                           "states_planned", "throughput_relative_to_failure_free",
                                                           "preemptions"))])
    section_s = time.perf_counter() - scale_runs.started
    print_table(
        f"1,000 nodes ({scale_section.DP} x {scale_section.PP}), synthetic trace (0.1 preemptions/node-hour, bursts "
        "of 4.3); every strategy plans the whole fleet with the runtime's planner, one worker process each "
        f"({workers}, beside the p3 runs; wall and CPU taken in the worker; "
        f"{section_s:.1f} s from start to last result). Baseline of the ratio: failure-free = plain "
        f"{scale_section.DP} x {scale_section.PP} 1F1B, no preemption",
        ["strategy", "simulated h", "wall s", "CPU s", "states planned", "throughput / failure-free", "preemptions"],
        scale_rows,
    )
    figures["scale_1000_nodes_24h_section"] = {"worker_processes": scale_runs.workers,
                                               "wall_seconds_start_to_last_result": round(section_s, 3)}
    figures["scale_1000_nodes_24h"] = scale
    return figures


def _breakdown_table(results: dict[str, SimResult], name: str) -> None:
    """Where each strategy's wall time went (`runtime.sim.engine.TIME_BUCKETS`), in hours."""
    print_table(
        f"{name}: where the wall time went, hours (the five buckets sum to the trace; 'failure-free "
        "equivalent' = the hours the failure-free job needs for the samples kept, so training minus it is "
        "what slower steps cost: redundant work, fewer pipelines, re-routed holes)",
        ["strategy", *TIME_BUCKETS, "failure-free equivalent"],
        [
            [s, *(round(r.breakdown[k] / 3600, 3) for k in TIME_BUCKETS),
             r.summary()["failure_free_equivalent_hours"]]
            for s, r in results.items()
        ],
    )


def _relations(results: dict, title: str) -> list[dict]:
    relations = []
    for a, b, published, source in PUBLISHED:
        if a not in results or b not in results:
            continue
        ours = results[a].samples_per_s / results[b].samples_per_s if results[b].samples_per_s else float("inf")
        relations.append(
            {
                "faster": a,
                "than": b,
                "simulated_ratio": ours,
                "published_ratio": published,
                "direction_holds": ours > 1.0,
                "source": source,
            }
        )
    print_table(
        title,
        ["relation (strategy / its baseline strategy)", "simulated throughput ratio", "published", "direction holds"],
        [
            [f"{r['faster']} / {r['than']}", r["simulated_ratio"], r["published_ratio"], r["direction_holds"]]
            for r in relations
        ],
    )
    return relations


def _explain(model: IterationModel, peers: IterationModel, dp: int, pp: int) -> dict:
    """The step times behind the relations: failure-free per strategy and the cost of one loss."""
    free = model.full_pipelines(dp)
    rows = {
        "failure_free_1f1b_step_s": free,
        "bamboo_failure_free_step_s (redundant forwards)": model.bamboo((True,) * pp, pipelines=dp),
        "bamboo_one_takeover_step_s": model.bamboo((False,) + (True,) * (pp - 1), pipelines=dp),
        "recycle_failure_free_step_s (fiw)": model.recycle((0,) * pp, pipelines=dp),
        "recycle_one_hole_step_s": model.recycle((1,) + (0,) * (pp - 1), pipelines=dp),
        "recycle_peers_one_hole_step_s (as published)": peers.recycle((1,) + (0,) * (pp - 1), pipelines=dp),
        "oobleck_one_node_lost_step_s": model.oobleck(dp * pp - 1),
    }
    print_table(
        "step times behind the relations (replays of the runtime's schedules)",
        ["state", "step s"],
        [[k, v] for k, v in rows.items()],
    )
    return rows


def _notes(
    relations: list[dict], why: dict, model: IterationModel, dp: int, params: SimParams, checkpoint: SimResult
) -> list[str]:
    """Say why a published relation does not hold (direction or rough size), with the numbers."""
    notes = []
    for r in relations:
        ratio, published = r["simulated_ratio"], r["published_ratio"]
        if r["direction_holds"] and ratio >= published / 2:
            continue
        pair = (r["faster"], r["than"])
        if pair == ("recycle", "oobleck"):
            extra = model.microbatches / max(dp - 1, 1)
            notes.append(
                f"recycle/oobleck {ratio:.2f} (published up to {published}): one hole makes recycle's step "
                f"{why['recycle_one_hole_step_s']:.3f} s against oobleck's re-planned "
                f"{why['oobleck_one_node_lost_step_s']:.3f} s; with dp={dp} each surviving peer would take "
                f"{extra:.1f} extra micro-batches, and spill (the runtime's default) puts some on other "
                f"stages' nodes by a compute-only score, while this cost model also charges each new host "
                f"that stage's gradient all-reduce and the extra activation traffic; with peers only (ReCycle "
                f"as published, the {PEERS} row) one hole costs "
                f"{why['recycle_peers_one_hole_step_s (as published)']:.3f} s"
            )
        elif pair == ("bamboo", "checkpoint"):
            interval = checkpoint.checkpoint_interval_s or 0.0
            notes.append(
                f"bamboo/checkpoint {ratio:.2f} (published {published}): checkpoint-restart writes a "
                f"checkpoint in {params.checkpoint_cost_s:.1f} s every {interval:.0f} s of compute and restarts "
                f"in {params.restart_total_s:.1f} s (rendezvous {params.rendezvous_s:g} s + reload), so a loss "
                f"costs it about {interval / 2 + params.restart_total_s + params.detection_s:.0f} s; bamboo "
                f"runs redundant forwards and keeps its replicas' state (each stage's reduced gradient "
                f"forwarded to its replica and applied there) on every step "
                f"({why['bamboo_failure_free_step_s (redundant forwards)']:.3f} s vs "
                f"{why['failure_free_1f1b_step_s']:.3f} s failure-free) and writes the same periodic checkpoints "
                f"(the time breakdown above shows where each strategy's hours went). "
                f"The restart-time table (without --quick) shows what the published ratio needs"
            )
        elif pair == ("recycle", "bamboo"):
            notes.append(
                f"recycle/bamboo {ratio:.2f} (published up to {published}): recycle's one-hole step "
                f"{why['recycle_one_hole_step_s']:.3f} s vs bamboo's takeover {why['bamboo_one_takeover_step_s']:.3f} s"
            )
    return notes


BAMBOO_ISSUE_TARGET = 3.0
"""bamboo / checkpoint-restart throughput that issue 20 asks the p3 trace to show."""
BAMBOO_RATIOS_ASKED = (
    BAMBOO_ISSUE_TARGET,
    next(ratio for top, bottom, ratio, _ in PUBLISHED if (top, bottom) == ("bamboo", "checkpoint")),
)
"""bamboo / checkpoint-restart ratios whose implied restart time the bench reports: the issue's target
and the Bamboo paper's figure (`PUBLISHED`)."""
RESTART_SEARCH_MAX_S = 7200.0


def checkpoint_rate_with_restart(trace: Trace, model: IterationModel, params: SimParams, restart_s: float) -> float:
    """Checkpoint-restart's samples per second on `trace` with each restart taking `restart_s`."""
    p = SimParams(**{**_params_kwargs(params), "restart_s": restart_s})
    return simulate(trace, strategy="checkpoint", model=model, params=p, samples_per_microbatch=4).samples_per_s


def restart_for_ratio(trace: Trace, model: IterationModel, params: SimParams, bamboo_samples_per_s: float,
                      ratio: float, *, tolerance_s: float = 1.0) -> float | None:
    """The checkpoint-restart restart time (seconds, to `tolerance_s`) at which bamboo's throughput
    (`bamboo_samples_per_s`, which no restart time changes) is `ratio` x checkpoint-restart's on
    `trace`, by bisection: checkpoint-restart's throughput falls as each restart grows. None when
    even `RESTART_SEARCH_MAX_S` is not enough."""

    def reached(restart_s: float) -> bool:
        ck_rate = checkpoint_rate_with_restart(trace, model, params, restart_s)
        return ck_rate <= 0 or bamboo_samples_per_s / ck_rate >= ratio

    low, high = params.restart_total_s, RESTART_SEARCH_MAX_S
    if reached(low):
        return round(low, 1)
    if not reached(high):
        return None
    while high - low > tolerance_s:
        middle = (low + high) / 2
        if reached(middle):
            high = middle
        else:
            low = middle
    return round(high, 1)


def _params_kwargs(params: SimParams) -> dict:
    return {k: getattr(params, k) for k in SimParams.__slots__}
