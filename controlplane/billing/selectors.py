"""Reads on the cost ledger."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Q, QuerySet

from controlplane.billing.models import BillingSegment


def segment_list(*, team_ids: Iterable[int], job_id: int | None = None, instance_id: int | None = None
                 ) -> QuerySet[BillingSegment]:
    """Segments of the given teams (and optionally one job or instance), oldest first."""
    qs = BillingSegment.objects.filter(team_id__in=list(team_ids)).select_related(
        "instance__instance_type", "instance__zone"
    )
    if job_id is not None:
        qs = qs.filter(job_id=job_id)
    if instance_id is not None:
        qs = qs.filter(instance_id=instance_id)
    return qs.order_by("start", "instance_id", "id")


def segments_in_force(*, job_id: int, at: datetime) -> QuerySet[BillingSegment]:
    """The job's segments running at `at` (start <= at < end, or still open)."""
    return BillingSegment.objects.filter(job_id=job_id, start__lte=at).filter(Q(end__gt=at) | Q(end__isnull=True))
