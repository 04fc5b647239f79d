"""Reads on training jobs. Each returns a queryset with what its serializer touches already
joined or prefetched, so a page of results costs a constant number of queries."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Count, Q, QuerySet

from controlplane.fleet.states import LIVE_STATES
from controlplane.jobs.models import JobEvent, JobGeneration, MetricSample, Reconfiguration, TrainingJob


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
