"""`bench runtime`'s runs past 8 ranks: 16 (DP=4 x PP=4) and 32 (DP=8 x PP=4) real processes.

Each run loses one node, then two at once, then gives a third a notice (recycle, emulated device
time, tiny model), and reports for each event the time from the injection to the next generation's
first commit and where it went (`breakdown`). The goal at 32 ranks is <= 0.5 s kill -> next commit,
as at 8.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.report import Progress, print_table
from runtime.config import DeviceTime, JobConfig, ModelSpec
from runtime.train.launcher import Fault, RunResult, run_local

KILL_TO_COMMIT_GOAL_S = 0.5
"""Kill -> next commit at 32 ranks (issue 20), as at 8."""

SIZES = ((4, 4), (8, 4))
"""(dp, pp): 16 and 32 ranks."""

OUT_DIR = Path("var/bench/runtime")
PHASES = (
    ("detection_or_notice_step_s", "detected / notice step done"),
    ("survivors_answered_s", "survivors answered (store)"),
    ("planning_s", "plan"),
    ("rendezvous_and_group_s", "store barrier + gloo group"),
    ("schedule_s", "schedule"),
    ("first_step_s", "first step"),
)
"""The breakdown's phases, in order (JSON key, label)."""


def rank_config(dp: int, pp: int, steps: int) -> JobConfig:
    """The job of the runs past 8 ranks (and of tests/runtime/test_sixteen_ranks.py): tiny, emulated
    device time, so 2 cores carry 32 ranks."""
    return JobConfig(
        dp=dp,
        pp=pp,
        microbatches=2,
        global_batch=4 * dp,
        steps=steps,
        model=ModelSpec(n_layer=2),
        strategy="recycle",
        schedule="fiw",
        device_time=DeviceTime(forward_ms=2.0),
        op_timeout_s=2.0,
        heartbeat_timeout_s=4.0,
    )


def _faults(pp: int, first: int) -> list[Fault]:
    """Node ids of pipeline p, stage s: p * pp + s. Stage 1 and 2 nodes of pipelines 1 and 2."""
    return [
        Fault(node=pp + 1, kind="kill", step=first),
        Fault(node=pp + 2, kind="kill", step=first + 3),
        Fault(node=2 * pp + 1, kind="kill", step=first + 3),
        Fault(node=2 * pp + 2, kind="notice", step=first + 6),
    ]


def _events(result: RunResult, name: str) -> list[dict[str, Any]]:
    return [r for r in result.records if r.get("event") == name]


def _first_commit(result: RunResult, generation: int | None) -> float | None:
    """When `generation` first committed a step (its first node to record it)."""
    return min((r["time"] for r in result.steps() if r["generation"] == generation), default=None)


def breakdown(result: RunResult) -> list[dict[str, Any]]:
    """Per injected event (the kills of one step count as one): where injection -> the next
    generation's first commit went. Kill: detection (-> first `failure_detected`); notice: the step
    it came in finishing (-> its commit, in the old generation). Then, on the member that computed
    the plan: waiting on the store for every survivor's answer, and the plan itself; the new
    generation's store barrier and group (slowest member), its schedule, and its first step."""
    injected: dict[int, dict[str, Any]] = {}
    for r in result.records:
        if str(r.get("event", "")).startswith("inject_"):
            entry = injected.setdefault(r["step"], {"kind": r["event"][7:], "time": r["time"], "nodes": []})
            entry["time"] = min(entry["time"], r["time"])
            entry["nodes"].append(r["node"])
    rows = []
    for step, inj in sorted(injected.items()):
        t0 = inj["time"]
        gens = sorted({g["generation"] for g in _events(result, "generation") if g["time"] > t0})
        nxt = gens[0] if gens else None
        commit = _first_commit(result, nxt)
        if inj["kind"] == "kill":
            seen = min((d["time"] for d in _events(result, "failure_detected") if d["time"] > t0), default=None)
        else:  # the notice's own step commits in the old generation
            seen = max((r["time"] for r in result.steps() if r["generation"] == (nxt or 1) - 1), default=None)
        regroups = [g for g in _events(result, "regroup") if g["generation"] == nxt]
        decider = next((g for g in regroups if g["decide_s"] is not None), None)
        ready = [g for g in _events(result, "generation_ready") if g["generation"] == nxt]
        ready_at = max((g["time"] for g in ready), default=None)
        rows.append(
            {
                "event": f"{inj['kind']} {sorted(inj['nodes'])} in step {step}",
                "kind": inj["kind"],
                "next_generation": nxt,
                "inject_to_next_commit_s": commit - t0 if commit else None,
                "detection_or_notice_step_s": seen - t0 if seen else None,
                "survivors_answered_s": decider["form_s"] - decider["decide_s"] if decider else None,
                "planning_s": decider["decide_s"] if decider else None,
                "rendezvous_and_group_s": max((g["barrier_s"] + g["group_s"] for g in ready), default=None),
                "schedule_s": max((g["schedule_s"] for g in ready), default=None),
                "first_step_s": commit - ready_at if commit and ready_at else None,
            }
        )
    return rows


def run(*, quick: bool, progress: Progress, done: int = 0, total: int = 2) -> dict[str, Any]:
    """One faulted run per size; returns the figures and prints their table."""
    steps, first = (11, 1) if quick else (14, 2)
    out: dict[str, Any] = {"goal_kill_to_next_commit_s_at_32_ranks": KILL_TO_COMMIT_GOAL_S}
    for i, (dp, pp) in enumerate(SIZES):
        progress.step(f"emulated: recycle at {dp * pp} ranks (kill, kill two, notice)", done + i, total)
        config = rank_config(dp, pp, steps)
        result = run_local(config, faults=_faults(pp, first), timeout_s=240)
        out[f"ranks_{dp * pp}"] = {
            "dp": dp,
            "pp": pp,
            "steps": steps,
            "wall_s": result.wall_s,
            "exit_codes": {str(n): c for n, c in result.exit_codes.items()},
            "events": breakdown(result),
        }
    _print(out)
    out["plot"] = _plot(out)
    print(f"plot: {out['plot']}")
    return out


def _plot(out: dict[str, Any]) -> dict[str, str]:
    """Stacked bars: each event's injection -> next commit, by phase, at 16 and 32 ranks."""
    import plotly.graph_objects as go

    from runtime.sim.plots import write_figure

    labels, values = [], {key: [] for key, _ in PHASES}
    for key, entry in out.items():
        if key.startswith("ranks_"):
            for e in entry["events"]:
                labels.append(f"{entry['dp'] * entry['pp']} ranks: {e['event']}")
                for phase, _ in PHASES:
                    values[phase].append(e[phase] or 0.0)
    fig = go.Figure([go.Bar(name=label, x=labels, y=values[key]) for key, label in PHASES])
    fig.add_hline(y=KILL_TO_COMMIT_GOAL_S, line_dash="dash", annotation_text="goal at 32 ranks (kill)")
    fig.update_layout(barmode="stack", title="injection -> next commit, by phase (emulated device time)",
                      yaxis_title="seconds", width=1000, height=600)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return write_figure(fig, OUT_DIR, "recovery_past_8_ranks")


def main() -> None:
    """`python -m bench.runtime_ranks [--quick] [--json PATH]`: this section alone."""
    parser = argparse.ArgumentParser(prog="python -m bench.runtime_ranks")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out = run(quick=args.quick, progress=Progress())
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))



def _print(out: dict[str, Any]) -> None:
    rows = []
    for key, entry in out.items():
        if not key.startswith("ranks_"):
            continue
        for e in entry["events"]:
            rows.append([entry["dp"] * entry["pp"], e["event"], e["inject_to_next_commit_s"],
                         e["detection_or_notice_step_s"], e["survivors_answered_s"], e["planning_s"],
                         e["rendezvous_and_group_s"], e["schedule_s"], e["first_step_s"]])
    print_table(
        f"recovery past 8 ranks (emulated device time; goal: kill -> next commit <= {KILL_TO_COMMIT_GOAL_S} s "
        "at 32 ranks; seconds)",
        ["ranks", "event", "-> next commit", "detected / notice step", "survivors answered", "plan",
         "barrier+group", "schedule", "first step"],
        rows,
    )


if __name__ == "__main__":
    main()
