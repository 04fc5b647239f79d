"""Money read from the billing ledger for the dashboard: spend over a window, spend rate now, cost
so far per job, and the per-job cost report (totals, per instance type and zone, on-demand
equivalent, savings, and the cost of work lost to preemptions).

A `BillingSegment` is a stretch of one instance's life at one price; an open segment (`end` null)
is billed up to `now`. Durations are summed in Python over `values_list` rows: a job has tens to
thousands of segments, and doing the interval arithmetic in Python keeps SQLite and PostgreSQL
identical (the two disagree on datetime subtraction)."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from controlplane.billing.models import BillingSegment
from controlplane.jobs.models import Reconfiguration, TrainingJob

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


def team_spend(*, team_ids: Iterable[int], start: datetime, end: datetime) -> Spend:
    """What the teams' instances cost in [start, end)."""
    rows = (
        BillingSegment.objects.filter(team_id__in=list(team_ids), start__lt=end)
        .exclude(end__lte=start)
        .values_list("start", "end", "price_per_hour", "on_demand_price_per_hour")
    )
    cost = on_demand = ZERO
    for seg_start, seg_end, price, od_price in rows:
        lo, hi = _clip(seg_start, seg_end, start, end)
        hours = _hours(lo, hi)
        cost += hours * price
        on_demand += hours * od_price
    return Spend(cost=cost, on_demand=on_demand)


def team_daily_spend(*, team_ids: Iterable[int], start: datetime, end: datetime) -> list[tuple[datetime, Spend]]:
    """Spend per UTC day in [start, end), one entry per day (days without spend count 0)."""
    day0 = start.replace(hour=0, minute=0, second=0, microsecond=0)
    days = []
    day = day0
    while day < end:
        days.append(day)
        day += timedelta(days=1)
    cost: dict[datetime, Decimal] = defaultdict(Decimal)
    on_demand: dict[datetime, Decimal] = defaultdict(Decimal)
    rows = (
        BillingSegment.objects.filter(team_id__in=list(team_ids), start__lt=end)
        .exclude(end__lte=start)
        .values_list("start", "end", "price_per_hour", "on_demand_price_per_hour")
    )
    for seg_start, seg_end, price, od_price in rows:
        lo, hi = _clip(seg_start, seg_end, start, end)
        cursor = lo
        while cursor < hi:
            day = cursor.replace(hour=0, minute=0, second=0, microsecond=0)
            stop = min(hi, day + timedelta(days=1))
            hours = _hours(cursor, stop)
            cost[day] += hours * price
            on_demand[day] += hours * od_price
            cursor = stop
    return [(day, Spend(cost=cost[day], on_demand=on_demand[day])) for day in days]


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


@dataclass(slots=True)
class CostLine:
    """One row of a breakdown: a pool, an instance type or a zone."""

    instance_type: str = ""
    zone: str = ""
    instances: set[int] = field(default_factory=set)
    hours: Decimal = ZERO
    cost: Decimal = ZERO
    on_demand: Decimal = ZERO

    def add(self, *, instance_id: int, hours: Decimal, cost: Decimal, on_demand: Decimal) -> None:
        self.instances.add(instance_id)
        self.hours += hours
        self.cost += cost
        self.on_demand += on_demand

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type, "zone": self.zone, "instances": len(self.instances),
            "hours": str(self.hours.quantize(HOURS)), "cost": money(self.cost),
            "on_demand_equivalent": money(self.on_demand), "savings": money(self.on_demand - self.cost),
        }


@dataclass(frozen=True, slots=True)
class PreemptionLoss:
    """Training time lost to one reconfiguration, priced at the job's burn rate at that moment
    (every node of the job is paid for while the lost work is redone)."""

    at: datetime
    trigger: str
    decision: str
    instance: str
    lost_seconds: float
    burn_rate_per_hour: Decimal

    @property
    def cost(self) -> Decimal:
        return Decimal(repr(self.lost_seconds)) / _SECONDS_PER_HOUR * self.burn_rate_per_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(), "trigger": self.trigger, "decision": self.decision,
            "instance": self.instance, "lost_seconds": round(self.lost_seconds, 3),
            "burn_rate_per_hour": money(self.burn_rate_per_hour), "cost": money(self.cost),
        }


@dataclass(frozen=True, slots=True)
class JobCostReport:
    """What a job cost, where, against on-demand, and what preemptions cost it."""

    job: TrainingJob
    generated_at: datetime
    by_pool: list[CostLine]
    by_instance_type: list[CostLine]
    by_zone: list[CostLine]
    losses: list[PreemptionLoss]

    @property
    def cost(self) -> Decimal:
        return sum((line.cost for line in self.by_pool), ZERO)

    @property
    def on_demand(self) -> Decimal:
        return sum((line.on_demand for line in self.by_pool), ZERO)

    @property
    def hours(self) -> Decimal:
        return sum((line.hours for line in self.by_pool), ZERO)

    @property
    def lost(self) -> Decimal:
        return sum((loss.cost for loss in self.losses), ZERO)

    @property
    def savings_pct(self) -> str | None:
        if not self.on_demand:
            return None
        return str(((1 - self.cost / self.on_demand) * 100).quantize(Decimal("0.01")))

    def totals(self) -> dict[str, Any]:
        return {
            "cost": money(self.cost), "on_demand_equivalent": money(self.on_demand),
            "savings": money(self.on_demand - self.cost), "savings_pct": self.savings_pct,
            "lost_to_preemptions": money(self.lost), "instance_hours": str(self.hours.quantize(HOURS)),
            "preemptions": len(self.losses),
            "budget": None if self.job.budget_usd is None else money(self.job.budget_usd),
        }

    def to_dict(self) -> dict[str, Any]:
        job = self.job
        return {
            "job": {"id": job.pk, "name": job.name, "status": job.status, "strategy": job.strategy},
            "currency": "USD",
            "generated_at": self.generated_at.isoformat(),
            "totals": self.totals(),
            "by_pool": [line.to_dict() for line in self.by_pool],
            "by_instance_type": [line.to_dict() for line in self.by_instance_type],
            "by_zone": [line.to_dict() for line in self.by_zone],
            "preemption_losses": [loss.to_dict() for loss in self.losses],
        }

    def to_csv(self) -> str:
        """One table: a row per pool, instance type and zone, the preemption losses, then totals."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["section", "instance_type", "zone", "instances", "hours", "cost_usd",
                         "on_demand_equivalent_usd", "savings_usd", "lost_seconds", "at"])
        for section, lines in (("pool", self.by_pool), ("instance_type", self.by_instance_type),
                               ("zone", self.by_zone)):
            for line in lines:
                d = line.to_dict()
                writer.writerow([section, d["instance_type"], d["zone"], d["instances"], d["hours"], d["cost"],
                                 d["on_demand_equivalent"], d["savings"], "", ""])
        for loss in self.losses:
            writer.writerow(["preemption_loss", "", "", "", "", money(loss.cost), "", "",
                             round(loss.lost_seconds, 3), loss.at.isoformat()])
        totals = self.totals()
        writer.writerow(["total", "", "", len({i for line in self.by_pool for i in line.instances}),
                         totals["instance_hours"], totals["cost"], totals["on_demand_equivalent"],
                         totals["savings"], "", ""])
        writer.writerow(["lost_to_preemptions", "", "", "", "", totals["lost_to_preemptions"], "", "", "", ""])
        return out.getvalue()


def _burn_rate_at(intervals: list[tuple[datetime, datetime, Decimal]], at: datetime) -> Decimal:
    return sum((price for start, end, price in intervals if start <= at < end), ZERO)


def job_cost_report(*, job: TrainingJob, now: datetime | None = None) -> JobCostReport:
    """Build the cost report of `job` from its billing segments and reconfigurations."""
    now = now or timezone.now()
    pools: dict[tuple[str, str], CostLine] = {}
    types: dict[str, CostLine] = {}
    zones: dict[str, CostLine] = {}
    intervals: list[tuple[datetime, datetime, Decimal]] = []
    rows = BillingSegment.objects.filter(job_id=job.pk).values_list(
        "instance_id", "instance__instance_type__name", "instance__zone__code", "start", "end",
        "price_per_hour", "on_demand_price_per_hour",
    )
    for instance_id, type_name, zone_code, start, end, price, od_price in rows:
        lo, hi = _clip(start, end, None, now)
        hours = _hours(lo, hi)
        intervals.append((lo, hi, price))
        zone_code = zone_code or "-"
        amounts = {"instance_id": instance_id, "hours": hours, "cost": hours * price, "on_demand": hours * od_price}
        pools.setdefault((type_name, zone_code), CostLine(instance_type=type_name, zone=zone_code)).add(**amounts)
        types.setdefault(type_name, CostLine(instance_type=type_name)).add(**amounts)
        zones.setdefault(zone_code, CostLine(zone=zone_code)).add(**amounts)
    losses = []
    reconfigurations = Reconfiguration.objects.filter(job_id=job.pk).order_by("decided_at", "id").values_list(
        "decided_at", "trigger", "decision", "instance__provider_instance_id", "instance_id", "lost_seconds"
    )
    for decided_at, trigger, decision, provider_id, instance_id, lost_seconds in reconfigurations:
        losses.append(PreemptionLoss(
            at=decided_at, trigger=trigger, decision=decision,
            instance=provider_id or (f"instance {instance_id}" if instance_id else ""),
            lost_seconds=float(lost_seconds or 0), burn_rate_per_hour=_burn_rate_at(intervals, decided_at),
        ))

    def ordered(lines: Iterable[CostLine]) -> list[CostLine]:
        return sorted(lines, key=lambda line: (-line.cost, line.instance_type, line.zone))

    return JobCostReport(
        job=job, generated_at=now, by_pool=ordered(pools.values()), by_instance_type=ordered(types.values()),
        by_zone=ordered(zones.values()), losses=losses,
    )
