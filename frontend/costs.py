"""Money read from the billing ledger for the dashboard: spend rate now, cost so far per job, a job's
cost curve, and the cost page (billing's report plus per-pool and per-preemption views of it). A
team's spend over a window is billing's (`controlplane.billing.reports.teams_daily_spend`).

A `BillingSegment` is a stretch of one instance's life at one price; an open segment (`end` null)
is billed up to `now`. Durations are summed in Python over `values_list` rows: a job has tens to
thousands of segments, and doing the interval arithmetic in Python keeps SQLite and PostgreSQL
identical (the two disagree on datetime subtraction)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from controlplane.billing.models import BillingSegment
from controlplane.billing.reports import job_cost_report
from controlplane.jobs.models import Reconfiguration, TrainingJob
from runtime.planner.capacity_policy import CAPACITY_TYPES

ZERO = Decimal(0)
MONEY = Decimal("0.0001")
HOURS = Decimal("0.001")
_SECONDS_PER_HOUR = Decimal(3600)


def money(value: Decimal) -> str:
    """USD as a string with 4 decimals (spot costs of short runs are fractions of a cent)."""
    return str(value.quantize(MONEY))


def _hours(start: datetime, end: datetime) -> Decimal:
    seconds = (end - start).total_seconds()
    return Decimal(repr(max(seconds, 0.0))) / _SECONDS_PER_HOUR


def _clip(start: datetime, end: datetime | None, lo: datetime | None, hi: datetime) -> tuple[datetime, datetime]:
    """The part of [start, end or hi) inside [lo, hi)."""
    real_end = min(end, hi) if end is not None else hi
    real_start = max(start, lo) if lo is not None else start
    return real_start, max(real_end, real_start)


@dataclass(frozen=True, slots=True)
class Spend:
    """Spend over a window, with what the same capacity would have cost on demand."""

    cost: Decimal
    on_demand: Decimal

    @property
    def savings(self) -> Decimal:
        return self.on_demand - self.cost


def team_spend_rate(*, team_ids: Iterable[int]) -> Spend:
    """USD per hour being spent now: the prices of the open segments."""
    rows = BillingSegment.objects.filter(team_id__in=list(team_ids), end__isnull=True).values_list(
        "price_per_hour", "on_demand_price_per_hour"
    )
    cost = on_demand = ZERO
    for price, od_price in rows:
        cost += price
        on_demand += od_price
    return Spend(cost=cost, on_demand=on_demand)


def job_spend_rate(*, job: TrainingJob) -> Decimal:
    """USD per hour the job is spending now: the prices of its open segments."""
    return sum(BillingSegment.objects.filter(job_id=job.pk, end__isnull=True).values_list("price_per_hour", flat=True),
               ZERO)


def job_costs_so_far(*, job_ids: Iterable[int], now: datetime | None = None) -> dict[int, Decimal]:
    """Cost so far of each job (missing jobs cost 0)."""
    now = now or timezone.now()
    totals: dict[int, Decimal] = defaultdict(Decimal)
    rows = BillingSegment.objects.filter(job_id__in=list(job_ids)).values_list(
        "job_id", "start", "end", "price_per_hour"
    )
    for job_id, start, end, price in rows:
        lo, hi = _clip(start, end, None, now)
        totals[job_id] += _hours(lo, hi) * price
    return dict(totals)


def job_capacity_split(*, job: TrainingJob, now: datetime | None = None) -> dict[str, dict[str, str]]:
    """Hours and cost so far of the job's spot and of its on-demand instances (`Instance.lifecycle`),
    clipped at `now` as the cost curve is, so the two add up to the page's cost so far. Both types
    are always listed (0 when unused)."""
    now = now or timezone.now()
    hours = dict.fromkeys(CAPACITY_TYPES, ZERO)
    cost = dict.fromkeys(CAPACITY_TYPES, ZERO)
    rows = BillingSegment.objects.filter(job_id=job.pk).values_list("instance__lifecycle", "start", "end",
                                                                      "price_per_hour")
    for lifecycle, start, end, price in rows:
        piece = _hours(*_clip(start, end, None, now))
        hours[lifecycle] = hours.get(lifecycle, ZERO) + piece
        cost[lifecycle] = cost.get(lifecycle, ZERO) + piece * price
    return {kind: {"hours": str(hours[kind].quantize(HOURS)), "cost_usd": money(cost[kind])} for kind in hours}


def job_cost_curve(*, job: TrainingJob, now: datetime | None = None) -> list[tuple[datetime, Decimal]]:
    """Cumulative cost of a job over time, at every point where its burn rate changes (the curve
    is piecewise linear between them)."""
    now = now or timezone.now()
    changes: dict[datetime, Decimal] = defaultdict(Decimal)
    for start, end, price in BillingSegment.objects.filter(job_id=job.pk).values_list("start", "end", "price_per_hour"):
        lo, hi = _clip(start, end, None, now)
        changes[lo] += price
        changes[hi] -= price
    points: list[tuple[datetime, Decimal]] = []
    rate = total = ZERO
    previous: datetime | None = None
    for at in sorted(changes):
        if previous is not None:
            total += _hours(previous, at) * rate
        rate += changes[at]
        points.append((at, total))
        previous = at
    return points


# --- The per-job cost report -----------------------------------------------------------------------


def job_cost_page(*, job: TrainingJob, now: datetime | None = None) -> dict[str, Any]:
    """The cost page's data: billing's report (`billing.reports.job_cost_report`, the same one the
    API, CSV and JSON downloads serve) plus two views of it the page adds: totals per pool
    (instance type x zone) and the loss of each reconfiguration, priced with billing's formula
    (lost seconds x the job's spend rate when it was decided)."""
    report = job_cost_report(job=job, as_of=now)
    pools: dict[tuple[str, str], dict[str, Any]] = {}
    for seg in report.segments:
        line = pools.setdefault((seg.instance_type, seg.zone), {"instance_type": seg.instance_type, "zone": seg.zone,
                                                                "instances": set(), "hours": ZERO, "cost": ZERO,
                                                                "on_demand": ZERO})
        line["instances"].add(seg.instance_id)
        line["hours"] += seg.hours
        line["cost"] += seg.cost
        line["on_demand"] += seg.on_demand_cost
    by_pool = [
        {"instance_type": line["instance_type"], "zone": line["zone"], "instances": len(line["instances"]),
         "hours": str(line["hours"].quantize(HOURS)), "cost_usd": money(line["cost"]),
         "on_demand_cost_usd": money(line["on_demand"]), "savings_usd": money(line["on_demand"] - line["cost"])}
        for line in sorted(pools.values(), key=lambda p: (-p["cost"], p["instance_type"], p["zone"]))
    ]
    losses = []
    reconfigurations = Reconfiguration.objects.filter(job_id=job.pk, lost_seconds__gt=0, decided_at__lte=report.as_of)
    for decided_at, trigger, decision, provider_id, lost_seconds in reconfigurations.order_by("decided_at", "id") \
            .values_list("decided_at", "trigger", "decision", "instance__provider_instance_id", "lost_seconds"):
        rate = sum((s.price_per_hour for s in report.segments
                    if s.start <= decided_at and (s.end is None or s.end > decided_at)), ZERO)
        losses.append({"at": decided_at, "trigger": trigger, "decision": decision, "instance": provider_id or "",
                       "lost_seconds": round(lost_seconds, 3), "spend_rate_per_hour": money(rate),
                       "cost_usd": money(Decimal(repr(lost_seconds)) / _SECONDS_PER_HOUR * rate)})
    return {"report": report.to_dict(), "as_of": report.as_of, "by_pool": by_pool, "preemption_losses": losses}
