"""Spend metered here, from the billing segments at the price in force: what limits are enforced
against. Cloud billing lags hours; the ledger is up to the second (a segment opens when a node runs
and closes when it ends, and a price change splits it), so spend to `at` and the rate at `at` are
exact sums over it, one query each meter."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Q, QuerySet

from controlplane.billing.models import BillingSegment
from controlplane.billing.reports import exact_hours


@dataclass(frozen=True, slots=True)
class Meter:
    """Spend to a moment and the rate it grows at then."""

    spent_usd: Decimal
    usd_per_hour: Decimal
    """The price per hour of the segments open at that moment (the fleet's spend rate)."""

    def projected(self, seconds: float) -> Decimal:
        """Spend `seconds` later at today's rate."""
        return self.spent_usd + self.usd_per_hour * Decimal(str(max(seconds, 0.0))) / Decimal(3600)

    def seconds_until(self, cap: Decimal) -> float | None:
        """Seconds until spend reaches `cap` at this rate (None: it does not grow; 0: reached)."""
        if self.spent_usd >= cap:
            return 0.0
        if self.usd_per_hour <= 0:
            return None
        return float((cap - self.spent_usd) / self.usd_per_hour * 3600)


def meter(segments: QuerySet[BillingSegment], *, at: datetime, since: datetime | None = None) -> Meter:
    """Spend of `segments` over [since, at) and their rate at `at`."""
    rows = segments.filter(start__lt=at).exclude(end__lte=since) if since else segments.filter(start__lt=at)
    spent = rate = Decimal(0)
    for start, end, price in rows.values_list("start", "end", "price_per_hour"):
        begin = max(start, since) if since else start
        stop = min(end, at) if end is not None else at
        spent += price * exact_hours(stop - begin)
        if end is None or end > at:
            rate += price
    return Meter(spent_usd=spent, usd_per_hour=rate)


def job_meter(*, job_id: int, at: datetime) -> Meter:
    """The job's spend to `at` (its whole life, resumes included) and its fleet's rate."""
    return meter(BillingSegment.objects.filter(job_id=job_id), at=at)


def month_start(at: datetime) -> datetime:
    """Midnight UTC of the first day of `at`'s month: where a monthly budget's month begins."""
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def team_month_meter(*, team_id: int, at: datetime) -> Meter:
    """The team's spend this calendar month (UTC) to `at`, and its rate."""
    segments = BillingSegment.objects.filter(team_id=team_id).filter(Q(end__isnull=True) | Q(end__gt=month_start(at)))
    return meter(segments, at=at, since=month_start(at))
