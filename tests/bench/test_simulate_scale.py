"""`bench simulate`'s 1,000-node section (`bench._simulate_scale`): a run in a worker process is
the run this process would make, and recycle's slice is the start of the same trace."""

from __future__ import annotations

import os

from bench import _simulate_scale as scale
from runtime.config import ModelSpec
from runtime.parallel.throughput import CostModel
from runtime.sim.engine import SimParams

SPEC = ModelSpec(kind="mlp", n_layer=6, n_embd=8)  # 8 layers: one per stage of the 125 x 8 fleet
TIMINGS = ("wall_seconds", "cpu_seconds")
NICENESS_HERE = os.nice(0)


def _job() -> tuple[CostModel, SimParams]:
    layers = SPEC.num_layers
    cost = CostModel(fiw=[(0.01, 0.01, 0.01)] * layers, output_bytes=[0.0] * layers, param_bytes=[0.0] * layers)
    return cost, SimParams(checkpoint_cost_s=2.0)


def test_a_worker_process_runs_what_this_process_would():
    cost, params = _job()
    runs = scale.start(SPEC, cost, params, ["checkpoint"])
    with runs.pool:
        pooled = runs.futures["checkpoint"].result(timeout=300)
    here = scale.run_one("checkpoint", SPEC, cost, params)
    assert {k: v for k, v in pooled.items() if k not in TIMINGS} == {k: v for k, v in here.items() if k not in TIMINGS}
    assert pooled["simulated_hours"] == 24 and pooled["preemptions"] > 1000 and pooled["states_planned"] > 0
    assert all(pooled[k] > 0 for k in TIMINGS)
    assert runs.workers == 1  # one strategy: one worker, whatever the cores
    assert os.nice(0) == NICENESS_HERE  # the yielding priority is the worker's, not this process's


def test_recycle_replays_the_first_hours_of_the_same_trace():
    whole, cut = scale.trace_for("oobleck"), scale.trace_for("recycle")
    end = scale.RECYCLE_HOURS * 3600
    assert whole.duration_s == 24 * 3600 and cut.duration_s == end
    assert 0 < len(cut.events) < len(whole.events)
    assert cut.events == whole.events[: len(cut.events)]
    assert max(e.t_s for e in cut.events) < end <= whole.events[len(cut.events)].t_s
