"""Recovery planning at fleet scale: plan time and plan quality of every strategy vs nodes and losses.

`python -m bench scale [--quick] [--json PATH]` times each strategy's planning step
(`runtime.strategies.get_strategy(name).layout_for(config, slots)`, what every survivor runs after a
failure) for a GPT job (24 blocks, `fiw`, 8 micro-batches per pipeline; 2 x 4 nodes at 8 nodes,
pp = 8 above) at 8 to 1,024 nodes with 1, 2, 4 and 8 dead nodes (chosen by a seeded random draw),
fits the growth exponent of plan time in nodes, and reports each plan's exact step length (the
runtime's list schedule, unit cost per layer) against one baseline, the failure-free step of the
plain dp x pp `fiw` layout: throughput / failure-free next to the surviving-compute share (N-f)/N.
Recycle's placement before this planner (every candidate scored by a whole list schedule,
`bench/_spill_baseline.py`) is timed and compared up to 32 nodes; above, it takes minutes and is
skipped. Also times one exact list schedule of a whole 1,024-node layout. Plot: `var/bench/scale/`.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from pathlib import Path

from bench._spill_baseline import baseline_layout_for
from bench.report import Progress, print_table
from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.layout import Layout, pipelines_layout
from runtime.membership import plan_for_fleet
from runtime.schedule import _list_schedule, schedule_length, stage_durations
from runtime.sim.plots import write_figure
from runtime.strategies import get_strategy
from runtime.strategies.base import Slots, full_slots

STRATEGIES = ("recycle", "bamboo", "oobleck", "checkpoint")
NODES = (8, 16, 32, 64, 128, 256, 512, 1024)
DEAD = (1, 2, 4, 8)
BASELINE_MAX_NODES = 32
MODEL = ModelSpec(kind="gpt", n_layer=24, n_embd=64, n_head=2, seq_len=16, vocab_size=64)
OUT_DIR = Path("var/bench/scale")
TARGETS_MS = {64: 50.0, 1024: 200.0}
"""Plan-time targets (issue 20): every strategy at 64 nodes, and at 1,024 nodes with 8 dead."""


def job(nodes: int, strategy: str) -> JobConfig:
    pp = 4 if nodes < 16 else 8
    dp = nodes // pp
    return JobConfig(model=MODEL, dp=dp, pp=pp, microbatches=8, global_batch=dp * 8, strategy=strategy, schedule="fiw")


def dead_slots(config: JobConfig, dead: int) -> tuple[Slots, list[int]]:
    gone = random.Random(config.num_nodes * 100 + dead).sample(range(config.num_nodes), dead)
    return [[None if n in gone else n for n in row] for row in full_slots(config)], sorted(gone)


def step_length(layout: Layout) -> float:
    """Exact list-schedule step (`fiw`, unit cost per layer and direction)."""
    durations = stage_durations(layout, [(1.0, 1.0, 1.0)] * layout.num_layers)
    return schedule_length(layout, "fiw", durations)


def time_plan(plan, repeats: int) -> tuple[float, float, float, Layout]:  # type: ignore[no-untyped-def]
    """(first call ms, median wall ms, median CPU ms over `repeats` calls, the layout). CPU time is
    what the plan itself costs; wall time also counts other processes on this shared host."""
    walls, cpus = [], []
    layout = None
    for _ in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        layout = plan()
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    assert layout is not None
    return walls[0], statistics.median(walls), statistics.median(cpus), layout


def growth_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(time) on log(nodes)."""
    if len(points) < 2:
        return None
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(max(t, 1e-6)) for _, t in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def run(*, quick: bool, progress: Progress) -> dict:
    nodes_list = (8, 32, 64, 256, 1024) if quick else NODES
    dead_list = (1, 8) if quick else DEAD
    repeats = 3 if quick else 7
    baseline_max = 8 if quick else BASELINE_MAX_NODES
    cases = []
    for n_i, nodes in enumerate(nodes_list):
        free = step_length(pipelines_layout(job(nodes, "none"), full_slots(job(nodes, "none"))))
        for dead in dead_list:
            if dead > nodes // 2:
                continue
            progress.step(f"{nodes} nodes, {dead} dead", n_i + 1, len(nodes_list))
            for strategy in (*STRATEGIES, "recycle-baseline"):
                name = "recycle" if strategy == "recycle-baseline" else strategy
                config = job(nodes, name)
                slots, gone = dead_slots(config, dead)
                get_strategy(name).layout_for(config, full_slots(config))  # the job's start (warm caches)
                row: dict = {
                    "strategy": strategy,
                    "nodes": nodes,
                    "dp": config.dp,
                    "pp": config.pp,
                    "dead": dead,
                    "dead_nodes": gone,
                }
                if strategy == "recycle-baseline":
                    if nodes > baseline_max:
                        row["skipped"] = f"the schedule-search placement takes minutes above {baseline_max} nodes"
                        cases.append(row)
                        continue
                    plan = lambda c=config, s=slots: baseline_layout_for(c, s)  # noqa: E731
                    reps = 1
                else:
                    plan = lambda c=config, s=slots, k=name: get_strategy(k).layout_for(c, s)  # noqa: E731
                    reps = repeats
                try:
                    first, median, cpu, layout = time_plan(plan, reps)
                except LayoutError as exc:
                    row["error"] = str(exc)
                    cases.append(row)
                    continue
                step = step_length(layout)
                if strategy != "recycle-baseline":
                    # The whole membership decision the survivors and the control plane's reaction
                    # run (runtime.membership.plan_for_fleet: the layout, then every layer's holder).
                    _, fleet_ms, _, _ = time_plan(
                        lambda c=config, g=gone: plan_for_fleet(c, full_slots(c), gone=set(g), noticed=set()), reps)
                    row["membership_plan_ms_median"] = round(fleet_ms, 3)
                row.update(
                    {
                        "plan_ms_first_call": round(first, 3),
                        "plan_ms_median": round(median, 3),
                        "plan_cpu_ms_median": round(cpu, 3),
                        "plan_calls_timed": reps,
                        "planned_step_units": step,
                        "failure_free_step_units": free,
                        "throughput_vs_failure_free": round(free / step, 4),
                        "surviving_compute_share": round((nodes - dead) / nodes, 4),
                        "meets_surviving_compute_share": free / step >= (nodes - dead) / nodes - 1e-9,
                    }
                )
                cases.append(row)
    by = {(c["strategy"], c["nodes"], c["dead"]): c for c in cases}
    for c in cases:
        old = by.get(("recycle-baseline", c["nodes"], c["dead"]))
        if c["strategy"] == "recycle" and old and "planned_step_units" in old and "planned_step_units" in c:
            c["planned_step_vs_baseline_spill"] = round(c["planned_step_units"] / old["planned_step_units"], 4)
    figures = {
        "job": "gpt 24 blocks (n_embd 64), fiw, 8 micro-batches per pipeline; 2 x 4 at 8 nodes, N/8 x 8 above",
        "step_units": "exact list-schedule step with unit cost per layer and direction (F, I, W)",
        "ratio_baseline": "failure-free step of the plain dp x pp fiw layout (strategy 'none')",
        "timing": f"median of {repeats} calls after the job's failure-free layout was planned (baseline: 1 call)",
        "cases": cases,
        "growth_exponent_plan_time_vs_nodes": _exponents(cases, dead_list),
        "exact_schedule_1024_nodes": _whole_schedule(),
    }
    figures["targets"] = _targets(cases)
    _print(figures)
    biggest = max(c["nodes"] for c in cases)
    print_table(
        f"membership plan (the runtime's make_plan, which the control plane's reaction runs) at {biggest} nodes",
        ["strategy", "dead", "ms (median)"],
        [[c["strategy"], c["dead"], c["membership_plan_ms_median"]] for c in cases
         if c["nodes"] == biggest and "membership_plan_ms_median" in c],
    )
    figures["plots"] = _plot(cases, dead_list)
    for kind, path in figures["plots"].items():
        print(f"{kind}: {path}")
    figures["gradient_traffic_vs_dp"] = gradient_traffic(quick=quick, progress=progress)
    return figures


def _exponents(cases: list[dict], dead_list: tuple[int, ...]) -> dict:
    out: dict = {}
    for strategy in (*STRATEGIES, "recycle-baseline"):
        for dead in dead_list:
            points = [
                (c["nodes"], c["plan_ms_median"])
                for c in cases
                if c["strategy"] == strategy and c["dead"] == dead and "plan_ms_median" in c
            ]
            exponent = growth_exponent(points)
            if exponent is not None:
                out[f"{strategy} ({dead} dead)"] = round(exponent, 2)
    return out


def _whole_schedule() -> dict:
    """One exact list schedule of a whole 1,024-node recycle layout (no group reuse)."""
    config = job(1024, "recycle")
    slots, _ = dead_slots(config, 8)
    layout = get_strategy("recycle").layout_for(config, slots)
    durations = stage_durations(layout, [(1.0, 1.0, 1.0)] * layout.num_layers)
    started = time.perf_counter()
    order = _list_schedule(layout, "fiw", durations)
    whole_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    schedule_length(layout, "fiw", durations)
    grouped_ms = (time.perf_counter() - started) * 1000
    tasks = sum(len(row) for row in order.values())
    return {
        "tasks": tasks,
        "whole_layout_list_schedule_ms": round(whole_ms, 1),
        "schedule_length_ms (independent groups, each shape once)": round(grouped_ms, 1),
    }


def _targets(cases: list[dict]) -> list[dict]:
    out = []
    for nodes, limit in TARGETS_MS.items():
        for strategy in STRATEGIES:
            rows = [
                c
                for c in cases
                if c["strategy"] == strategy
                and c["nodes"] == nodes
                and "plan_ms_median" in c
                and (nodes == 64 or c["dead"] == 8)
            ]
            if rows:
                worst = max(c["plan_ms_median"] for c in rows)
                worst_cpu = max(c["plan_cpu_ms_median"] for c in rows)
                out.append(
                    {
                        "strategy": strategy,
                        "nodes": nodes,
                        "dead": sorted(c["dead"] for c in rows),
                        "worst_plan_ms_median": worst,
                        "worst_plan_cpu_ms_median": worst_cpu,
                        "target_ms": limit,
                        "met": worst <= limit,
                    }
                )
    return out


def _print(figures: dict) -> None:
    cases = figures["cases"]
    rows = []
    for c in cases:
        if "skipped" in c or "error" in c:
            rows.append(
                [c["strategy"], c["nodes"], c["dead"], "-", "-", "-", "-", "-", "-", c.get("skipped") or c["error"]]
            )
            continue
        rows.append(
            [
                c["strategy"],
                c["nodes"],
                c["dead"],
                c["plan_ms_median"],
                c["plan_cpu_ms_median"],
                c["planned_step_units"],
                c["throughput_vs_failure_free"],
                c["surviving_compute_share"],
                c.get("planned_step_vs_baseline_spill", "-"),
                "" if c["meets_surviving_compute_share"] else "below (N-f)/N",
            ]
        )
    print_table(
        f"plan time and plan quality ({figures['timing']}); ratios against the failure-free step of the "
        "plain dp x pp fiw layout; last ratio: recycle's planned step / the schedule-search spill's",
        [
            "strategy",
            "nodes",
            "dead",
            "plan ms",
            "plan cpu ms",
            "step units",
            "throughput / failure-free",
            "(N-f)/N",
            "step / baseline spill",
            "note",
        ],
        rows,
    )
    print_table(
        "growth exponent of plan time in nodes (log-log least squares)",
        ["strategy", "exponent"],
        list(figures["growth_exponent_plan_time_vs_nodes"].items()),
    )
    print_table(
        "targets (plan ms, median)",
        ["strategy", "nodes", "worst ms", "worst cpu ms", "target ms", "met (wall)"],
        [
            [
                t["strategy"],
                t["nodes"],
                t["worst_plan_ms_median"],
                t["worst_plan_cpu_ms_median"],
                t["target_ms"],
                t["met"],
            ]
            for t in figures["targets"]
        ],
    )
    whole = figures["exact_schedule_1024_nodes"]
    print(
        f"\none exact list schedule of a whole 1,024-node layout ({whole['tasks']} tasks): "
        f"{whole['whole_layout_list_schedule_ms']} ms; schedule_length (groups): "
        f"{whole['schedule_length_ms (independent groups, each shape once)']} ms"
    )


def _plot(cases: list[dict], dead_list: tuple[int, ...]) -> dict[str, str]:
    import plotly.graph_objects as go

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    fig = go.Figure()
    palette = {
        "recycle": "#ef553b",
        "bamboo": "#00cc96",
        "oobleck": "#636efa",
        "checkpoint": "#ab63fa",
        "recycle-baseline": "#7f7f7f",
    }
    dashes = ("solid", "dot", "dash", "longdash")
    for strategy in (*STRATEGIES, "recycle-baseline"):
        for k, dead in enumerate(dead_list):
            points = sorted(
                (c["nodes"], c["plan_ms_median"])
                for c in cases
                if c["strategy"] == strategy and c["dead"] == dead and "plan_ms_median" in c
            )
            if points:
                fig.add_trace(
                    go.Scatter(
                        x=[n for n, _ in points],
                        y=[t for _, t in points],
                        mode="lines+markers",
                        name=f"{strategy}, {dead} dead",
                        line={"color": palette[strategy], "dash": dashes[k % len(dashes)]},
                    )
                )
    for nodes, limit in TARGETS_MS.items():
        fig.add_trace(
            go.Scatter(
                x=[nodes],
                y=[limit],
                mode="markers",
                marker={"symbol": "x", "size": 12, "color": "black"},
                name=f"target {limit:g} ms at {nodes} nodes",
            )
        )
    fig.update_layout(title="recovery plan time vs nodes (log-log)", width=1000, height=650)
    fig.update_xaxes(type="log", title_text="nodes")
    fig.update_yaxes(type="log", title_text="plan time, ms (median)")
    return write_figure(fig, OUT_DIR, "plan_time")


def gradient_traffic(*, quick: bool, progress: Progress) -> list[dict]:
    """Bytes each node sends in one gradient all-reduce against dp, counted on the real exchange
    (`bench.grad_traffic`: `runtime.comm`'s reduce-scatter + all-gather over gloo, threads of this
    process), next to the previous all-to-all's (dp-1)x and the ring bound 2(dp-1)/dp."""
    from bench.grad_traffic import measure, plot

    dps = (2, 4, 8) if quick else (2, 4, 8, 16, 32)
    rows = []
    for i, dp in enumerate(dps):
        progress.step(f"gradient traffic: dp={dp}", i, len(dps))
        rows.append(measure(dp))
    print_table(
        "gradient all-reduce: bytes sent per node (measured) / gradient bytes; baseline: the previous all-to-all, "
        "(dp-1)x by construction",
        ["dp", "gradient bytes", "max sent per node", "sent / gradient", "all-to-all / gradient",
         "ring bound / gradient", "bits = fixed-order fold"],
        [[r["dp"], r["gradient_bytes"], r["max_bytes_sent_per_node"], round(r["max_sent_over_gradient_bytes"], 4),
          r["previous_all_to_all_over_gradient_bytes"], round(r["ring_bound_over_gradient_bytes"], 4),
          r["bit_identical_to_fixed_order_fold"]] for r in rows],
    )
    print(f"gradient traffic plot: {plot(rows, OUT_DIR)}")
    return rows
