"""Reads on the cost ledger."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Q, QuerySet

from controlplane.billing.models import BillingSegment


def segment_list(*, team_ids: Iterable[int]) -> QuerySet[BillingSegment]:
    """Segments of the given teams, oldest first (the API's filters narrow it: api/filters.py)."""
    qs = BillingSegment.objects.filter(team_id__in=list(team_ids)).select_related(
        "instance__instance_type", "instance__zone"
    )
    return qs.order_by("start", "instance_id", "id")


def segments_in_force(*, job_id: int, at: datetime) -> QuerySet[BillingSegment]:
    """The job's segments running at `at` (start <= at < end, or still open)."""
    return BillingSegment.objects.filter(job_id=job_id, start__lte=at).filter(Q(end__gt=at) | Q(end__isnull=True))
