"""Bytes each node sends for one gradient all-reduce, counted on the real exchange.

`measure(dp)` runs `runtime.distributed.comm.Comm`'s reduce-scatter + all-gather among `dp` owners of one layer
run (threads of this process, each a real gloo group member over a shared store) and reads every
node's `Comm.bytes_sent`; it also checks that every owner ends with the bits of the single-process
fixed-order fold (`runtime.distributed.grad_order`). `python -m bench grad_traffic` (and `bench
scale`) print it against dp.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.report import Progress, print_table
from runtime.config import JobConfig, ModelSpec
from runtime.distributed.comm import Comm
from runtime.distributed.grad_order import RunSum, grad_plan, home_pipelines
from runtime.strategies import initial_layout

OUT_DIR = Path("var/bench/grad_traffic")
LAYER_NUMEL = (40_000, 25_000)
"""Two layers of one stage (float32: 260 kB of gradient): big enough that headers do not count."""


def measure(dp: int, *, seed: int = 0) -> dict[str, Any]:
    """One all-reduce of a pp=1 job's gradient among `dp` pipelines: per-node bytes sent, and
    whether every owner got the fixed-order sum bit for bit."""
    config = JobConfig(dp=dp, pp=1, microbatches=1, global_batch=dp, model=ModelSpec(n_layer=1))
    layout = initial_layout(config)
    plan = grad_plan(layout, home_pipelines(config))
    layer_numel = dict(enumerate(LAYER_NUMEL))
    run = RunSum(plan, 0, len(LAYER_NUMEL), layer_numel)
    gen = torch.Generator().manual_seed(seed)
    grads = {n: torch.randn(run.numel, generator=gen) * 10.0 ** (n % 5 - 2) for n in range(dp)}
    expected = run.fold(grads)
    store = dist.HashStore()
    sent: dict[int, int] = {}
    same: dict[int, bool] = {}
    errors: list[BaseException] = []

    def node(n: int) -> None:
        try:
            comm = Comm(store, prefix="traffic", node=n, members=range(dp), timeout_s=60.0)
            handle = comm.allreduce(grads[n], tuple(range(dp)), 0, run)
            comm.reduce_chunk(handle)
            total = comm.finish_allreduce(handle)
            comm.wait_sends()
            sent[n] = comm.bytes_sent
            same[n] = torch.equal(total, expected)
            comm.close()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(n,), daemon=True) for n in range(dp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    gradient_bytes = run.numel * 4
    return {
        "dp": dp,
        "gradient_bytes": gradient_bytes,
        "max_bytes_sent_per_node": max(sent.values()),
        "mean_bytes_sent_per_node": sum(sent.values()) / dp,
        "max_sent_over_gradient_bytes": max(sent.values()) / gradient_bytes,
        "previous_all_to_all_over_gradient_bytes": dp - 1,
        "ring_bound_over_gradient_bytes": 2 * (dp - 1) / dp,
        "bit_identical_to_fixed_order_fold": all(same.values()) and len(same) == dp,
    }




def plot(rows: list[dict[str, Any]], out_dir: Path) -> dict[str, str]:
    """Bytes sent per node / gradient bytes against dp: measured, the previous all-to-all, the ring bound."""
    import plotly.graph_objects as go

    from runtime.sim.plots import write_figure

    dps = [r["dp"] for r in rows]
    fig = go.Figure()
    for key, name in (
        ("max_sent_over_gradient_bytes", "reduce-scatter + all-gather (measured)"),
        ("previous_all_to_all_over_gradient_bytes", "previous all-to-all, (dp-1)x"),
        ("ring_bound_over_gradient_bytes", "ring bound, 2(dp-1)/dp"),
    ):
        fig.add_trace(go.Scatter(x=dps, y=[r[key] for r in rows], mode="lines+markers", name=name))
    fig.update_layout(title="gradient all-reduce: bytes sent per node / gradient bytes", width=900, height=550)
    fig.update_xaxes(type="log", title_text="dp (owners of a layer run)")
    fig.update_yaxes(type="log", title_text="bytes sent per node / gradient bytes")
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_figure(fig, out_dir, "gradient_traffic")


def run(*, quick: bool = False, progress: Progress | None = None, out_dir: Path = OUT_DIR) -> list[dict]:
    """Bytes each node sends in one gradient all-reduce against dp, counted on the real exchange
    (`measure`: `runtime.distributed.comm`'s reduce-scatter + all-gather over gloo, threads of this
    process), next to the previous all-to-all's (dp-1)x and the ring bound 2(dp-1)/dp. `bench scale`
    runs it too."""
    progress = progress or Progress()

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
    print(f"gradient traffic plot: {plot(rows, out_dir)}")
    return rows
