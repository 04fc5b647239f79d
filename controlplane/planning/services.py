"""Planning a job: turn an API or command request into a `runtime.planner` request, price it with
the market's pools, and return the plan (or a `PlanInfeasible` with the nearest feasible plan)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.utils import timezone

from controlplane.common.errors import DomainError
from controlplane.jobs.models import TrainingJob
from controlplane.planning.selectors import pools_for_plan
from runtime.config import ModelSpec
from runtime.planner.catalog import instance_types as shipped_types
from runtime.planner.profile import ProfileStore
from runtime.planner.search import Candidate, Plan, PlanError, Planner, PlanRequest

_PLANNER: Planner | None = None


def _planner() -> Planner:
    """One planner per process: it caches predicted profiles and replays across requests. Measured
    profiles stored under $SPOTPIPE_PROFILE_DIR (default var/profiles; `python -m runtime.planner
    profile` writes them) win over predictions and train the predictor."""
    global _PLANNER
    if _PLANNER is None:
        root = Path(os.environ.get("SPOTPIPE_PROFILE_DIR", "var/profiles"))
        _PLANNER = Planner(store=ProfileStore(root) if root.is_dir() else None)
    return _PLANNER


class PlanInfeasible(DomainError):
    """A valid request no plan can satisfy; carries the nearest feasible plan when there is one."""

    status_code = 422

    def __init__(self, message: str, *, field: str, nearest: Candidate | None) -> None:
        super().__init__(message, field=field)
        self.nearest = nearest


@dataclass(frozen=True, slots=True)
class PlanInput:
    model: ModelSpec
    global_batch: int
    samples: int
    instance_types: list[str]
    zones: list[str] | None = None
    deadline_hours: float | None = None
    budget_usd: float | None = None
    strategy: str = "recycle"
    max_nodes: int = 32
    microbatch_size: int = 0


def model_spec_from_job(job: TrainingJob) -> tuple[ModelSpec, int]:
    """(ModelSpec, global batch) from a job's `model_spec` JSON (layers, d_model, heads, ...)."""
    spec = job.model_spec or {}
    model = ModelSpec(
        kind=spec.get("kind", "gpt"),
        n_layer=int(spec.get("layers", spec.get("n_layer", 4))),
        n_embd=int(spec.get("d_model", spec.get("n_embd", 32))),
        n_head=int(spec.get("heads", spec.get("n_head", 2))),
        seq_len=int(spec.get("seq_len", 16)),
        vocab_size=int(spec.get("vocab", spec.get("vocab_size", 64))),
    )
    return model, int(spec.get("global_batch", 16))


def plan_input_from_job(*, job: TrainingJob, instance_types: list[str], at: datetime, **overrides) -> PlanInput:
    """Defaults from the job: model and batch from its spec, samples = target steps x global batch,
    deadline and budget from the job (each overridable)."""
    model, global_batch = model_spec_from_job(job)
    deadline = None
    if job.deadline is not None:
        deadline = (job.deadline - at).total_seconds() / 3600.0
        if deadline <= 0:
            raise DomainError(f"the job's deadline {job.deadline.isoformat()} has passed", field="job")
    fields = {
        "model": model,
        "global_batch": global_batch,
        "samples": job.target_steps * global_batch,
        "instance_types": instance_types,
        "deadline_hours": deadline,
        "budget_usd": float(job.budget_usd) if job.budget_usd is not None else None,
        "strategy": job.strategy if job.strategy in ("checkpoint", "bamboo", "recycle", "oobleck") else "recycle",
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return PlanInput(**fields)


def plan_compute(*, data: PlanInput, team_ids: Iterable[int] | None, at: datetime | None = None) -> tuple[Plan, list]:
    """Plan `data` against the pools of its allowed types. Raises `DomainError` (400) naming the
    field for bad input and `PlanInfeasible` (422) with the nearest plan when nothing satisfies it."""
    at = at or timezone.now()
    known = shipped_types()
    unknown = [t for t in data.instance_types if t not in known]
    if unknown:
        raise DomainError(
            f"instance type(s) {unknown} have no profile or datasheet; known: {sorted(known)}", field="instance_types"
        )
    pools = pools_for_plan(
        instance_types=data.instance_types, zones=data.zones, at=at, team_ids=team_ids, max_nodes=data.max_nodes
    )
    request = PlanRequest(
        model=data.model,
        global_batch=data.global_batch,
        samples=data.samples,
        pools=pools,
        deadline_hours=data.deadline_hours,
        budget_usd=data.budget_usd,
        strategy=data.strategy,
        microbatch_size=data.microbatch_size,
    )
    try:
        return _planner().plan(request), pools
    except PlanError as exc:
        if exc.field in ("deadline_hours", "budget_usd") or (exc.field == "pools" and exc.nearest is None and pools):
            raise PlanInfeasible(exc.message, field=exc.field, nearest=exc.nearest) from exc
        raise DomainError(exc.message, field=exc.field) from exc
