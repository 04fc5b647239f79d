"""Training throughput against plain PyTorch: `python -m bench training [--quick] [--json PATH]`.

Tokens/s of `spotpipe train` failure-free (strategies `none` and `recycle`, no emulated device time)
against plain PyTorch on the same model (gpt-nano: 4 blocks, 4 heads, width 128, context 128, byte
vocabulary), the same data (a token file of Python standard library sources, as the byte tokenizer
gives them), the same micro-batches and the same number of processes, measured in the same run:

- dp=1 pp=1: spotpipe's one worker process against a plain single-process loop (nn.Sequential of
  the same layers, `torch.optim.AdamW`, micro-batches accumulated into `.grad`). Both run with
  `torch.set_num_threads(1)` (what every spotpipe worker sets), each in a process of its own.
- pp > 1: `torch.distributed.pipelining` (PipelineStage + Schedule1F1B, spotpipe's default schedule
  `1f1b`) on the same stage split, over gloo, one process per stage started with forkserver like
  spotpipe's; for dp > 1 the stages' gradients are all-reduced over gloo (one flat buffer per stage)
  before AdamW steps.

Both sides time steady-state steps: the interval between consecutive step ends, warm-up steps
skipped (so process start-up, data opening and first-step allocation are left out of both); a run's
figure is the 25th percentile of its intervals, as in `bench runtime` (other engineers' jobs share
this machine's cores in bursts), medians are in the JSON too. Each layout runs `rounds` rounds of
the three sides back to back; ratios are taken within a round and the median over rounds reported.
spotpipe's step end is its commit (the small all-reduce every step ends with), as written in its
rank's metrics log. On this 2-core machine, dp=2 pp=2 (4 processes) is
oversubscribed, for both sides alike: the output says so.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import queue
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import Progress, print_table
from runtime.data.sampler import permuted

OUT_DIR = Path("var/bench/training")
TARGET_RATIO = 0.9
SEED = 0
CORPUS_FILES = ("argparse.py", "typing.py", "inspect.py", "pathlib/_local.py", "dataclasses.py", "enum.py")
"""Standard library sources concatenated into the corpus (those missing on an interpreter are skipped)."""


def corpus_tokens(path: Path) -> dict[str, Any]:
    """Write the corpus as a nanoGPT token file of its UTF-8 bytes (uint16); returns what it holds."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [stdlib / name for name in CORPUS_FILES if (stdlib / name).is_file()]
    data = b"".join(p.read_bytes() for p in parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.frombuffer(data, dtype=np.uint8).astype(np.uint16).tofile(path)
    return {"files": [p.name for p in parts], "tokens": len(data), "path": str(path)}


# -- spotpipe ---------------------------------------------------------------------------------------
def spotpipe_run(tokens: Path, *, strategy: str, dp: int, pp: int, microbatches: int, global_batch: int,
                 steps: int, warmup: int) -> dict[str, Any]:
    """One `spotpipe train` run (in-process entry, real worker processes); steady-state step times."""
    from runtime.train.metrics_log import read_records
    from spotpipe.train import TrainOptions, run_train

    with tempfile.TemporaryDirectory(prefix="spotpipe-bench-training-") as tmp:
        out = Path(tmp)
        log = io.StringIO()
        code = run_train(
            TrainOptions(data=f"tokens:{tokens}", model="gpt-nano", dp=dp, pp=pp, microbatches=microbatches,
                         global_batch=global_batch, steps=steps, strategy=strategy, seed=SEED, out=out,
                         timeout_s=600),
            out=log, err=log,
        )
        if code != 0:
            raise RuntimeError(f"spotpipe train ({strategy}, dp={dp} pp={pp}) failed ({code}):\n{log.getvalue()}")
        records = [r for r in read_records(out / "ranks" / "metrics-0.jsonl") if "step_time_s" in r]
    ends = {r["step"]: r["time"] for r in records}
    intervals = [ends[s] - ends[s - 1] for s in sorted(ends) if s - 1 in ends and s >= warmup]
    compute = [sum(r["stage_times_s"].values()) for r in records if r["step"] >= warmup]
    return {"step_s": intervals, "compute_s": compute}


# -- plain PyTorch ----------------------------------------------------------------------------------
def _sample_ids(windows: int, first: int, count: int) -> np.ndarray:
    """Stream positions first .. first+count-1 of seeded per-epoch permutations (spotpipe's rule)."""
    positions = np.arange(first, first + count)
    epochs, offsets = np.divmod(positions, windows)
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs):
        out[epochs == epoch] = permuted(windows, SEED, int(epoch), offsets[epochs == epoch])
    return out


def _windows(train: np.ndarray, ids: np.ndarray, length: int) -> Any:
    import torch

    rows = torch.from_numpy(np.stack([train[i * length : i * length + length + 1] for i in ids]).astype(np.int64))
    return rows[:, :-1], rows[:, 1:]


def _plain_rank(rank: int, world: dict[str, Any], results: Any) -> None:
    """One process of the plain PyTorch run: the whole model (pp=1) or one pipeline stage."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from runtime.config import model_preset
    from runtime.models.model import build_layer

    torch.set_num_threads(1)  # as every spotpipe worker
    spec = model_preset("gpt-nano")
    dp, pp, mbs, size = world["dp"], world["pp"], world["microbatches"], world["microbatch_size"]
    pipeline, stage = divmod(rank, pp)
    lo, hi = world["stages"][stage]
    module = nn.Sequential(*(build_layer(spec, i, SEED) for i in range(lo, hi)))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    tokens = np.memmap(world["tokens"], dtype=np.uint16, mode="r")
    length = spec.seq_len
    train = tokens[: len(tokens) - max(length + 1, int(len(tokens) * 0.05))]
    windows = (len(train) - 1) // length
    global_batch = dp * mbs * size

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:  # this pipeline's micro-batches, in order
        return _windows(train, _sample_ids(windows, step * global_batch + pipeline * mbs * size, mbs * size), length)

    schedule = dp_group = None
    if pp * dp > 1:
        store = dist.TCPStore("127.0.0.1", world["port"], world_size=dp * pp, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=dp * pp)
        pp_groups = [dist.new_group([p * pp + s for s in range(pp)]) for p in range(dp)]
        dp_groups = [dist.new_group([p * pp + s for p in range(dp)]) for s in range(pp)]
        dp_group = dp_groups[stage] if dp > 1 else None
    if pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        pipe = PipelineStage(module, stage, pp, torch.device("cpu"), group=pp_groups[pipeline])
        schedule = Schedule1F1B(pipe, n_microbatches=mbs, loss_fn=loss_fn)
    params = list(module.parameters())
    ends = []
    for step in range(world["steps"]):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        if schedule is None:  # the plain single-process loop
            for j in range(mbs):
                part = slice(j * size, (j + 1) * size)
                (loss_fn(module(x[part]), y[part]) / mbs).backward()
        elif stage == 0:
            schedule.step(x)
        elif stage == pp - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        if dp_group is not None:  # data parallel: the mean of the pipelines' gradients
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=dp_group)
            flat /= dp
            at = 0
            for p in params:
                p.grad.copy_(flat[at : at + p.numel()].view_as(p))
                at += p.numel()
        opt.step()
        ends.append(time.time())
    results.put((rank, ends))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def plain_run(tokens: Path, *, dp: int, pp: int, microbatches: int, global_batch: int, steps: int,
              warmup: int) -> dict[str, Any]:
    """The plain PyTorch run: dp*pp processes (forkserver, like spotpipe's launcher); rank 0's
    steady-state step intervals."""
    import torch.distributed as dist

    from runtime.config import JobConfig, model_preset
    from runtime.strategies import initial_layout

    config = JobConfig(model=model_preset("gpt-nano"), dp=dp, pp=pp, microbatches=microbatches,
                       global_batch=global_batch, strategy="none", steps=steps)
    layout = initial_layout(config)  # spotpipe's stage split, for the same stages
    stages = [layout.stages[stage] for stage, _ in layout.routes[0]]
    store = dist.TCPStore("127.0.0.1", 0, world_size=dp * pp + 1, is_master=True, wait_for_workers=False)
    world = {"dp": dp, "pp": pp, "microbatches": microbatches, "microbatch_size": config.microbatch_size,
             "stages": stages, "tokens": str(tokens), "steps": steps, "port": store.port}
    ctx = mp.get_context("forkserver")
    results = ctx.Queue()
    procs = [ctx.Process(target=_plain_rank, args=(rank, world, results), daemon=True) for rank in range(dp * pp)]
    for proc in procs:
        proc.start()
    got: dict[int, list[float]] = {}
    deadline = time.monotonic() + 600
    try:
        while len(got) < len(procs):
            with contextlib.suppress(queue.Empty):
                rank, ends = results.get(timeout=0.5)
                got[rank] = ends
                continue
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"plain PyTorch run (dp={dp} pp={pp}) failed: exit codes "
                                   f"{[p.exitcode for p in procs]}")
        for proc in procs:
            proc.join(timeout=60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    ends = got[0]
    return {"step_s": [ends[s] - ends[s - 1] for s in range(max(warmup, 1), len(ends))], "stages": stages}


# -- the benchmark ----------------------------------------------------------------------------------
def _typical(intervals: list[float]) -> float:
    """Step time of the least-disturbed quarter of a run's steady steps (25th percentile): other jobs
    share this machine's cores in bursts; applied alike to every side (medians are in the JSON)."""
    ordered = sorted(intervals)
    return ordered[len(ordered) // 4]


def run(*, quick: bool, progress: Progress) -> dict[str, Any]:
    """Per layout, rounds of plain PyTorch, spotpipe none and spotpipe recycle runs back to back
    (the order rotates each round, so a burst of other work on the machine hits each side alike).
    A ratio is taken within a round (spotpipe / the plain run next to it); the figures are the
    medians over rounds."""
    from runtime.config import model_preset

    spec = model_preset("gpt-nano")
    steps, warmup, rounds = (8, 3, 1) if quick else (14, 4, 4)
    microbatches, size = 4, (2 if quick else 4)
    layouts = [(1, 1), (1, 2)] if quick else [(1, 1), (1, 2), (2, 2)]
    tokens = OUT_DIR / "corpus.bin"
    corpus = corpus_tokens(tokens)
    cores = os.cpu_count() or 1
    figures: dict[str, Any] = {
        "setup": {
            "model": "gpt-nano: 4 blocks, 4 heads, width 128, context 128, byte vocabulary (256); 6 layers",
            "corpus": corpus,
            "microbatches_per_pipeline": microbatches,
            "microbatch_samples": size,
            "tokens_per_sample": spec.seq_len,
            "steps_per_run": steps,
            "warmup_steps_skipped": warmup,
            "rounds": rounds,
            "threads_per_process": 1,
            "schedule": "1f1b (spotpipe) / Schedule1F1B (torch.distributed.pipelining)",
            "device_time": None,
            "cpu_cores": cores,
            "load_average_at_start": os.getloadavg()[0],
            "figure": "tokens/s = global batch x 128 / (25th percentile of a run's steady-state step intervals); "
                      "ratio = spotpipe / plain PyTorch of the same round; medians over rounds",
        }
    }
    sides = ("plain_pytorch", "spotpipe_none", "spotpipe_recycle")
    total = len(layouts) * rounds * len(sides)
    done = 0
    for dp, pp in layouts:
        global_batch = dp * microbatches * size
        tokens_per_step = global_batch * spec.seq_len
        speed: dict[str, list[float]] = {side: [] for side in sides}
        speed_median: dict[str, list[float]] = {side: [] for side in sides}
        compute: dict[str, list[float]] = {side: [] for side in sides[1:]}
        stages = None
        for r in range(rounds):
            order = sides[r % len(sides):] + sides[: r % len(sides)]
            for side in order:
                progress.step(f"dp={dp} pp={pp}: {side} (round {r + 1}/{rounds})", done, total)
                done += 1
                kw = dict(dp=dp, pp=pp, microbatches=microbatches, global_batch=global_batch, steps=steps,
                          warmup=warmup)
                if side == "plain_pytorch":
                    got = plain_run(tokens, **kw)
                    stages = got["stages"]
                else:
                    got = spotpipe_run(tokens, strategy=side.removeprefix("spotpipe_"), **kw)
                    compute[side] += got["compute_s"]
                speed[side].append(tokens_per_step / _typical(got["step_s"]))
                speed_median[side].append(tokens_per_step / statistics.median(got["step_s"]))
        row: dict[str, Any] = {
            "dp": dp,
            "pp": pp,
            "processes": dp * pp,
            "oversubscribed": dp * pp > cores,
            "global_batch_samples": global_batch,
            "tokens_per_step": tokens_per_step,
            "stages_layers": [list(s) for s in stages or []],
        }
        for side in sides:
            row[f"{side}_tokens_per_s"] = statistics.median(speed[side])
            row[f"{side}_tokens_per_s_per_round"] = speed[side]
            row[f"{side}_tokens_per_s_from_median_step"] = statistics.median(speed_median[side])
        for side in sides[1:]:
            ratios = [s / b for s, b in zip(speed[side], speed["plain_pytorch"], strict=True)]
            row[f"{side}_ratio"] = statistics.median(ratios)
            row[f"{side}_ratio_per_round"] = ratios
            row[f"{side}_rank0_compute_s_median"] = statistics.median(compute[side])
            row[f"{side}_meets_target"] = row[f"{side}_ratio"] >= TARGET_RATIO
        figures[f"dp{dp}_pp{pp}"] = row
    figures["target_ratio"] = TARGET_RATIO
    figures["setup"]["load_average_at_end"] = os.getloadavg()[0]
    figures["plots"] = _plot(figures)
    _print(figures)
    return figures


def _rows(figures: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, v) for k, v in figures.items() if k.startswith("dp") and isinstance(v, dict)]


def _print(figures: dict[str, Any]) -> None:
    rows = []
    for _, r in _rows(figures):
        label = f"dp={r['dp']} pp={r['pp']} ({r['processes']} proc{'s' if r['processes'] > 1 else ''}"
        label += ", oversubscribed)" if r["oversubscribed"] else ")"
        rows.append([label, r["plain_pytorch_tokens_per_s"], r["spotpipe_none_tokens_per_s"],
                     r["spotpipe_none_ratio"], r["spotpipe_recycle_tokens_per_s"], r["spotpipe_recycle_ratio"]])
    setup = figures["setup"]
    print_table(
        f"training: gpt-nano tokens/s, failure-free, no emulated device time, 1 thread per process, "
        f"{setup['cpu_cores']} cores (load {setup['load_average_at_start']:.1f}); target ratio >= {TARGET_RATIO}",
        ["layout", "plain PyTorch tok/s", "spotpipe none tok/s", "none / plain", "spotpipe recycle tok/s",
         "recycle / plain"],
        rows,
    )


def _plot(figures: dict[str, Any]) -> dict[str, str]:
    import plotly.graph_objects as go

    from runtime.sim.plots import write_figure

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows = _rows(figures)
    labels = [f"dp={r['dp']} pp={r['pp']}" for _, r in rows]
    fig = go.Figure()
    bars = (("plain_pytorch", "plain PyTorch", "#7f7f7f"), ("spotpipe_none", "spotpipe none", "#636efa"),
            ("spotpipe_recycle", "spotpipe recycle", "#ef553b"))
    for side, name, color in bars:
        fig.add_trace(go.Bar(x=labels, y=[r[f"{side}_tokens_per_s"] for _, r in rows], name=name,
                             marker_color=color))
    fig.update_layout(title="gpt-nano training throughput, failure-free (tokens/s, higher is better)",
                      barmode="group", width=900, height=500)
    fig.update_yaxes(title_text="tokens/s")
    return write_figure(fig, OUT_DIR, "training")


if __name__ == "__main__":  # pragma: no cover
    with contextlib.suppress(KeyboardInterrupt):
        run(quick=True, progress=Progress())
