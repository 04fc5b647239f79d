"""`python -m bench runtime --device cuda`: the GPU path measured for real (no emulated device time).

Four nodes (DP=2 x PP=2) share this host's GPUs (node i on GPU i modulo their count) and talk over
gloo through pinned host memory, as the runtime does between one-GPU spot VMs. Per strategy one run:
failure-free steps, then node 3 (pipeline 1, stage 1) SIGKILLed mid-step. Every ratio is to `none`
(1F1B, no fault tolerance) measured in the same invocation; stage busy times come from CUDA events.
On one GPU the four nodes take turns on it, so the failure-free overhead is what each strategy's
extra work costs on a shared device, not what four GPUs would see.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.report import Progress, print_table
from runtime.config import STRATEGIES as STRATEGY_NAMES
from runtime.config import JobConfig, ModelSpec
from runtime.strategies import get_strategy
from runtime.train.launcher import Fault, RunResult, run_local

STRATEGIES = STRATEGY_NAMES  # runtime/config.py owns the names
KILLED = 3
MODEL = ModelSpec(kind="gpt", n_layer=8, n_embd=512, n_head=8, seq_len=256, vocab_size=8192)
OUT_DIR = Path("var/bench/runtime_device")


def device_config(strategy: str, *, steps: int, device: str, precision: str) -> JobConfig:
    """The benchmark's job: a 10-layer GPT (8 blocks, width 512, 256 tokens, 8,192-token vocabulary),
    DP=2 x PP=2, 4 micro-batches of 4 samples per pipeline."""
    return JobConfig(
        model=MODEL, dp=2, pp=2, microbatches=4, global_batch=32, strategy=strategy,
        schedule=get_strategy(strategy).simulated_schedule, steps=steps, device=device, precision=precision,
        op_timeout_s=5.0, heartbeat_timeout_s=5.0,
        checkpoint_interval=5 if strategy == "checkpoint" else 0,
        checkpoint_dir=tempfile.mkdtemp(prefix="spotpipe-gpu-ckpt-") if strategy == "checkpoint" else "",
    )


def _stage_busy(result: RunResult, first_step: int, last_step: int) -> dict[str, float]:
    """Median busy seconds per step of each stage (CUDA events), over the failure-free window."""
    per_stage: dict[str, list[float]] = {}
    for r in result.steps():
        if first_step <= r["step"] < last_step and r["generation"] == 0:
            for stage, seconds in r.get("stage_times_s", {}).items():
                per_stage.setdefault(stage, []).append(seconds)
    return {stage: statistics.median(v) for stage, v in sorted(per_stage.items())}


def run_device(*, quick: bool, progress: Progress, device: str) -> dict[str, Any]:
    """One run per strategy on `device` (`cuda`; `cpu` runs the same job on the CPU, real compute, as
    a dry run of this code); prints the table, writes the plot, returns the figures."""
    from bench.runtime import analyze  # the CPU bench's analysis of a run: one owner of its figures
    from bench.runtime_ranks import breakdown

    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        from runtime.parallel.device import cuda_problem

        raise SystemExit(f"bench runtime --device cuda: no usable GPU here: {cuda_problem()}")
    precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    steps, fault_step = (12, 8) if quick else (24, 14)
    figures: dict[str, Any] = {
        "setup": {
            "gpu": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
            "gpus": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__,
            "cuda": torch.version.cuda, "nodes": 4, "dp": 2, "pp": 2, "precision": precision,
            "model": "gpt, 8 blocks, width 512, 8 heads, seq 256, vocab 8192 (10 layers)",
            "global_batch": 32, "microbatches_per_pipeline": 4, "steps": steps,
            "fault": f"SIGKILL of node {KILLED} (pipeline 1, stage 1) mid-step {fault_step}",
            "failure_free_window": f"steps 2..{fault_step - 1} of the same run",
            "transport": "gloo over pinned host memory (host-staged)",
            "stage_busy_source": "CUDA events" if cuda else "wall clock",
            "baseline": "none (1F1B, no fault tolerance), measured in this invocation",
        },
        "strategies": {},
    }
    for done, strategy in enumerate(STRATEGIES):
        progress.step(f"{device}: {strategy}", done, len(STRATEGIES))
        cfg = device_config(strategy, steps=steps, device=device, precision=precision)
        faults = [] if strategy == "none" else [Fault(node=KILLED, kind="kill", step=fault_step)]
        result = run_local(cfg, faults=faults, timeout_s=300)
        row = analyze(result, cfg, fault_step=fault_step if faults else None)
        row["stage_busy_s_per_step"] = _stage_busy(result, 2, fault_step)
        if faults:  # where kill -> next commit went, phase by phase (the CPU bench's breakdown)
            row["kill_breakdown"] = (breakdown(result) or [{}])[0]
        row["exit_codes"] = {str(n): c for n, c in result.exit_codes.items()}
        figures["strategies"][strategy] = row
    base = figures["strategies"]["none"]["failure_free_samples_per_s"]
    for row in figures["strategies"].values():
        ff, wf = row.get("failure_free_samples_per_s"), row.get("with_failures_samples_per_s")
        row["failure_free_ratio_to_none"] = ff / base if ff and base else None
        row["failure_free_overhead_vs_none"] = base / ff - 1 if ff and base else None
        row["with_failures_ratio_to_none"] = wf / base if wf and base else None
    _print(figures)
    _print_breakdown(figures)
    figures["plot"] = _plot(figures)
    print(f"plot: {figures['plot']}")
    return figures


def _print(figures: dict[str, Any]) -> None:
    setup = figures["setup"]
    rows = [
        [name, r.get("failure_free_samples_per_s"), r.get("failure_free_ratio_to_none"),
         r.get("failure_free_overhead_vs_none"), r.get("with_failures_samples_per_s", "-"),
         r.get("failure_to_next_commit_s", "-"), r.get("steps_lost", "-"),
         " ".join(f"{s}:{v * 1000:.0f}ms" for s, v in r["stage_busy_s_per_step"].items())]
        for name, r in figures["strategies"].items()
    ]
    print_table(
        f"runtime on {setup['gpu']} x{setup['gpus']} ({setup['precision']}, {setup['nodes']} nodes sharing it): "
        "ratios to `none` of this run",
        ["strategy", "ff samples/s", "ff ratio", "ff overhead", "w/ failure samples/s", "kill->commit s",
         "steps lost", "stage busy per step"],
        rows,
    )


def _print_breakdown(figures: dict[str, Any]) -> None:
    from bench.runtime_ranks import PHASES

    rows = [[name, *(r["kill_breakdown"].get(key) for key, _ in PHASES)]
            for name, r in figures["strategies"].items() if r.get("kill_breakdown")]
    print_table("kill -> next commit, by phase (seconds)", ["strategy", *(label for _, label in PHASES)], rows)


def _plot(figures: dict[str, Any]) -> dict[str, str]:
    """Failure-free samples/s and kill -> next commit per strategy, side by side (where plotly is
    installed: a GPU host may have torch alone, and the figures must not be lost for a picture)."""
    if importlib.util.find_spec("plotly") is None:
        return {"skipped": "plotly is not installed here (pip install plotly): the figures above are complete"}
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from runtime.sim.plots import write_figure

    names = list(figures["strategies"])
    rows = figures["strategies"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("failure-free samples/s", "kill -> next commit (s)"))
    fig.add_trace(go.Bar(x=names, y=[rows[n].get("failure_free_samples_per_s") for n in names], name="samples/s"),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=names[1:], y=[rows[n].get("failure_to_next_commit_s") for n in names[1:]],
                         name="kill -> commit"), row=1, col=2)
    fig.update_layout(title=f"runtime on {figures['setup']['gpu']} ({figures['setup']['precision']})",
                      width=1100, height=500, showlegend=False)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return write_figure(fig, OUT_DIR, "runtime_gpu")
