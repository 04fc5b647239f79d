"""When to checkpoint: Young/Daly from the failures this job has seen and its measured write cost.

Torch-free (the plan code and the control plane import it). Every rank must checkpoint at the same
steps, or no checkpoint is ever complete; so the interval is decided once per generation, by the
node that forms it, from values every member reported, and published in the plan
(`checkpoint_every`); a rank never derives it from its own clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.checkpointing.youngdaly import young_interval
from runtime.config import JobConfig

CHECKPOINTS = "checkpoints"
"""The folder under a job's checkpoint root that holds `step-N/` checkpoints (`runtime.checkpointing.checkpoints`)."""
_COMPLETES = re.compile(rf"(?:^|/){CHECKPOINTS}/step-(\d+)/model\.safetensors(?:\.index\.json)?$")


def completed_step(name: str) -> int | None:
    """The step whose checkpoint the file `name` (a path or key ending in `checkpoints/step-N/...`)
    completes: its model index, or the single `model.safetensors` a lone writer writes. Writers put
    these last, so their presence is what makes a checkpoint complete; None for any other file."""
    found = _COMPLETES.search(name)
    return int(found.group(1)) if found else None


def complete_steps(names: Iterable[str]) -> list[int]:
    """Steps of the complete checkpoints among the file names of a checkpoint root, oldest first.
    Torch-free: the runtime and the control plane (which lists the job's artifact folder) share it."""
    return sorted({step for name in names if (step := completed_step(name)) is not None})


def estimated_mtbf_s(prior_mtbf_s: float, elapsed_s: float, failures: int) -> float:
    """The job's mean time between failures: `(prior + elapsed) / (1 + failures)`, at most the prior.

    The configured `mtbf_s` counts as one pseudo-observation (the posterior mean of an exponential
    failure rate under a one-failure prior), so one early failure does not collapse the estimate to
    a few seconds, and failures seen pull it down as they accumulate. It never rises above the
    prior: a quiet stretch is no evidence the next reclaim is further away than the operator said.
    """
    estimate = (prior_mtbf_s + max(elapsed_s, 0.0)) / (1 + max(failures, 0))
    return min(prior_mtbf_s, estimate)


def checkpoint_interval_steps(
    config: JobConfig, *, cost_s: float | None = None, mtbf_s: float | None = None, step_time_s: float | None = None
) -> int:
    """Steps between checkpoints: `checkpoint_interval` when set (> 0), else Young/Daly turned into
    steps. Measured values (`cost_s`: the last checkpoint write, `mtbf_s`: `estimated_mtbf_s`,
    `step_time_s`: a recent step) replace the config's priors when given."""
    if config.checkpoint_interval > 0:
        return config.checkpoint_interval
    cost = cost_s if cost_s is not None else config.checkpoint_cost_s
    mtbf = mtbf_s if mtbf_s is not None else config.mtbf_s
    step = step_time_s if step_time_s is not None else config.step_time_s
    return max(1, round(young_interval(checkpoint_cost_s=cost, mtbf_s=mtbf) / max(step, 1e-9)))


def _largest(records: Mapping[int, Mapping[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records.values() if r.get(key)]
    return max(values) if values else None


def initial_durability(config: JobConfig, *, started_at: float) -> dict[str, Any]:
    """Generation 0's durability fields: the priors, and the job's start time."""
    return {"checkpoint_every": checkpoint_interval_steps(config), "failures": 0, "started_at": started_at}


def next_durability(
    config: JobConfig, *, started_at: float, failures: int, lost: bool, records: Mapping[int, Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """The durability fields of the next plan, from the previous plan's (`started_at`, `failures`).
    A generation formed because members were lost counts as one failure (a zone-wide reclaim of
    several nodes is one event). The checkpoint cost is the slowest writer's last write (a
    checkpoint is complete only when the last writer is done), the step time the slowest member's
    recent median."""
    started = started_at
    failures = failures + int(lost)
    mtbf = estimated_mtbf_s(config.mtbf_s, now - started, failures)
    every = checkpoint_interval_steps(
        config, cost_s=_largest(records, "checkpoint_cost_s"), mtbf_s=mtbf, step_time_s=_largest(records, "step_time_s")
    )
    return {"checkpoint_every": every, "failures": failures, "started_at": started, "mtbf_s": mtbf}


def checkpoint_due(step: int, total_steps: int, *, every: int, start_step: int) -> bool:
    """Whether the checkpoint of `step` (steps committed) is written: every `every` steps counted
    from the generation's start `start_step` (the interval may change with each generation), never
    at the job's last step (the final export, when there is one, is written then)."""
    return every > 0 and step < total_steps and step > start_step and (step - start_step) % every == 0
