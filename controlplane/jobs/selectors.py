"""Reads on training jobs. Each returns a queryset with what its serializer touches already
joined or prefetched, so a page of results costs a constant number of queries."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from controlplane.common.errors import DomainError
from controlplane.fleet.states import LIVE_STATES
from controlplane.jobs.models import JobEvent, JobGeneration, MetricSample, Reconfiguration, TrainingJob
from controlplane.jobs.prepare_step import prepare_progress
from controlplane.planning.services import PlanInput
from runtime.config import JobConfig, ModelSpec, resolve_strategy

RECENT_SAMPLES = 20
"""Step records a measured step time is the median of."""


def job_measured_step_s(job: TrainingJob) -> float | None:
    """Seconds per step the job measured lately (the median of its recent samples' rates), or None."""
    rates = list(MetricSample.objects.filter(job=job, samples_per_s__gt=0).order_by("-step")
                 .values_list("samples_per_s", flat=True)[:RECENT_SAMPLES])
    batch = (job.config or {}).get("global_batch")
    if not rates or not isinstance(batch, int) or batch <= 0:
        return None
    return batch / statistics.median(rates)


def job_list(*, team_ids: Iterable[int]) -> QuerySet[TrainingJob]:
    """Jobs of `team_ids`, newest first, with `live_instance_count` annotated."""
    return (
        TrainingJob.objects.filter(team_id__in=list(team_ids))
        .select_related("team", "created_by")
        .annotate(live_instance_count=Count("instances", filter=Q(instances__state__in=LIVE_STATES), distinct=True))
        .order_by("-created_at", "-id")
    )


def job_generation_list(*, job: TrainingJob) -> QuerySet[JobGeneration]:
    return JobGeneration.objects.filter(job_id=job.pk).order_by("number")


def job_reconfiguration_list(*, job: TrainingJob) -> QuerySet[Reconfiguration]:
    return Reconfiguration.objects.filter(job_id=job.pk).select_related("instance", "notice").order_by(
        "decided_at", "id"
    )


def job_event_list(*, job: TrainingJob) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job_id=job.pk).order_by("at", "id")


def job_metric_list(*, job: TrainingJob) -> QuerySet[MetricSample]:
    """Samples in step order (the (job, step) index serves it)."""
    return MetricSample.objects.filter(job_id=job.pk).order_by("step", "at", "id")


def job_plan_summary(*, job: TrainingJob, cost_so_far: Any = None, now: datetime | None = None) -> dict[str, Any]:
    """The job's plan as the job page shows it: the layout, who chose it, and the planner's
    predictions beside what the job measured so far (samples/s, step time, hours, cost)."""
    plan, config = job.plan or {}, job.config or {}
    predicted = plan.get("predicted") or {}
    now = now or timezone.now()
    rates = list(
        MetricSample.objects.filter(job=job, samples_per_s__isnull=False, samples_per_s__gt=0)
        .order_by("-step").values_list("samples_per_s", flat=True)[:50]
    )
    measured_rate = sum(rates) / len(rates) if rates else None
    global_batch = config.get("global_batch")
    elapsed_h = None
    projected_h = None
    if job.started_at is not None:
        elapsed_h = ((job.finished_at or now) - job.started_at).total_seconds() / 3600.0
        if job.steps_done and job.target_steps:
            projected_h = elapsed_h * job.target_steps / min(job.steps_done, job.target_steps)
    rows = [
        ("samples/s", predicted.get("samples_per_s"), measured_rate),
        ("step time (s)", predicted.get("step_s"),
         global_batch / measured_rate if measured_rate and global_batch else None),
        ("hours for the whole job", predicted.get("hours"), projected_h),
        ("cost (USD)", predicted.get("cost_usd"), float(cost_so_far) if cost_so_far is not None else None),
    ]
    return {
        "chosen_by": plan.get("chosen_by", ""),
        "provider": plan.get("provider", ""),
        "pools": ", ".join(f"{p['instance_type']}{'@' + p['zone'] if p.get('zone') else ''}"
                           for p in plan.get("pools") or []),
        "nodes": plan.get("nodes"), "dp": config.get("dp"), "pp": config.get("pp"),
        "microbatches": config.get("microbatches"), "strategy": config.get("strategy", ""),
        "schedule": config.get("schedule", ""),
        "objective": plan.get("objective", ""),
        "rows": [{"what": what, "predicted": p, "measured": m} for what, p, m in rows],
        "elapsed_hours": elapsed_h,
        "runner_ups": plan.get("runner_ups") or [],
        "prepare": prepare_progress(job),
    }


def job_runtime_config(job: TrainingJob) -> JobConfig:
    """The job's stored contract as the runtime's JobConfig (what its nodes run)."""
    return JobConfig.from_dict(job.config)


# --- A job as the planner's input (`POST /api/v1/plans/ {job: id}`, `manage.py plan --job`) ---


def model_spec_from_job(job: TrainingJob) -> tuple[ModelSpec, int]:
    """(ModelSpec, global batch) of a job's stored contract."""
    config = JobConfig.from_dict(job.config)
    return config.model, config.global_batch


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
        "strategy": resolve_strategy(job.strategy),
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return PlanInput(**fields)
