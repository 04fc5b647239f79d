"""A job's cost report: what it cost, against on-demand, and what preemptions cost.

Formulas (money in Decimal throughout, rounded only when presented):
- segment cost = price_per_hour x hours(end - start); an open segment ends at `as_of`.
- total = sum of segment costs; billed hours = sum of segment hours.
- on-demand equivalent = sum of on_demand_price_per_hour x hours over the same segments (the same
  capacity for the same time bought on demand).
- savings = on-demand equivalent - total; savings % = savings / on-demand equivalent x 100.
- by capacity type: hours and cost of the segments of spot instances and of on-demand instances
  (`Instance.lifecycle`); the two add up to billed hours and total.
- preemption loss = sum over the job's reconfigurations of lost_seconds / 3600 x the job's spend
  rate at the reconfiguration's `decided_at`, where the spend rate is the sum of price_per_hour of
  the job's segments in force at that moment (start <= t < end). The work lost while the job stalls
  or redoes steps was paid for by every instance still running: that is what is lost.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from controlplane.billing.models import BillingSegment
from runtime.planner.capacity_policy import CAPACITY_TYPES

if TYPE_CHECKING:
    from controlplane.jobs.models import TrainingJob

CENTS = Decimal("0.01")
MICRO = Decimal("0.000001")
HOURS_Q = Decimal("0.0001")
SECONDS_PER_HOUR = Decimal(3600)


def exact_hours(delta: timedelta) -> Decimal:
    """A duration in hours, exactly (no float on the way)."""
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return Decimal(max(micros, 0)) / Decimal(1_000_000) / SECONDS_PER_HOUR


def _usd(value: Decimal) -> str:
    return str(value.quantize(CENTS, rounding=ROUND_HALF_UP))


@dataclass(frozen=True, slots=True)
class SegmentCost:
    """One billing segment with its exact cost."""

    segment_id: int
    instance_id: int
    provider_instance_id: str
    instance_type: str
    zone: str
    lifecycle: str
    start: datetime
    end: datetime | None
    hours: Decimal
    price_per_hour: Decimal
    price_source: str
    cost: Decimal
    on_demand_cost: Decimal

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment_id": self.segment_id, "instance_id": self.instance_id,
            "provider_instance_id": self.provider_instance_id, "instance_type": self.instance_type,
            "zone": self.zone, "lifecycle": self.lifecycle, "start": self.start.isoformat(),
            "end": self.end.isoformat() if self.end else None, "hours": str(self.hours.quantize(HOURS_Q)),
            "price_per_hour": str(self.price_per_hour), "price_source": self.price_source,
            "cost_usd": str(self.cost.quantize(MICRO, rounding=ROUND_HALF_UP)),
            "on_demand_cost_usd": str(self.on_demand_cost.quantize(MICRO, rounding=ROUND_HALF_UP)),
        }


@dataclass(slots=True)
class Breakdown:
    """Totals of one instance type or zone."""

    key: str
    segments: int = 0
    hours: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)
    on_demand_cost: Decimal = Decimal(0)

    def to_dict(self, name: str) -> dict[str, Any]:
        return {name: self.key, "segments": self.segments, "hours": str(self.hours.quantize(HOURS_Q)),
                "cost_usd": _usd(self.cost), "on_demand_cost_usd": _usd(self.on_demand_cost)}


@dataclass(slots=True)
class CapacityLine:
    """Hours and cost of one capacity type (what the instances were bought as)."""

    segments: int = 0
    hours: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)

    def to_dict(self) -> dict[str, Any]:
        return {"segments": self.segments, "hours": str(self.hours.quantize(HOURS_Q)), "cost_usd": _usd(self.cost)}


def _capacity_lines() -> dict[str, CapacityLine]:
    # Every type listed, 0 when unused: readers need not test for a missing key.
    return {kind: CapacityLine() for kind in CAPACITY_TYPES}


@dataclass(slots=True)
class CostReport:
    """What a job cost. Amounts are exact Decimals; `to_dict`/`to_csv` round them for display."""

    job_id: int
    job_name: str
    as_of: datetime
    total: Decimal = Decimal(0)
    billed_hours: Decimal = Decimal(0)
    on_demand_equivalent: Decimal = Decimal(0)
    preemption_lost_seconds: float = 0.0
    preemption_loss: Decimal = Decimal(0)
    preemption_events: int = 0
    by_instance_type: dict[str, Breakdown] = field(default_factory=dict)
    by_zone: dict[str, Breakdown] = field(default_factory=dict)
    by_capacity_type: dict[str, CapacityLine] = field(default_factory=_capacity_lines)
    segments: list[SegmentCost] = field(default_factory=list)

    @property
    def savings(self) -> Decimal:
        return self.on_demand_equivalent - self.total

    @property
    def savings_pct(self) -> Decimal | None:
        if not self.on_demand_equivalent:
            return None
        return self.savings / self.on_demand_equivalent * 100

    def to_dict(self) -> dict[str, Any]:
        pct = self.savings_pct
        return {
            "job": self.job_id,
            "job_name": self.job_name,
            "as_of": self.as_of.isoformat(),
            "currency": "USD",
            "total_usd": _usd(self.total),
            "billed_hours": str(self.billed_hours.quantize(HOURS_Q)),
            "on_demand_equivalent_usd": _usd(self.on_demand_equivalent),
            "savings_usd": _usd(self.savings),
            "savings_pct": None if pct is None else str(pct.quantize(CENTS, rounding=ROUND_HALF_UP)),
            "preemption_events": self.preemption_events,
            "preemption_lost_seconds": round(self.preemption_lost_seconds, 3),
            "preemption_loss_usd": _usd(self.preemption_loss),
            "by_instance_type": [b.to_dict("instance_type") for b in self.by_instance_type.values()],
            "by_zone": [b.to_dict("zone") for b in self.by_zone.values()],
            "by_capacity_type": {kind: line.to_dict() for kind, line in self.by_capacity_type.items()},
            "segments": [s.to_dict() for s in self.segments],
        }

    CSV_COLUMNS = ("segment_id", "instance_id", "provider_instance_id", "instance_type", "zone", "lifecycle",
                   "start", "end", "hours", "price_per_hour", "price_source", "cost_usd", "on_demand_cost_usd",
                   "spot_capacity_hours", "spot_capacity_cost_usd", "on_demand_capacity_hours",
                   "on_demand_capacity_cost_usd")
    """The last four split hours and cost by capacity type: a segment fills its own type's pair, the
    TOTAL line both. Columns, not extra lines, so readers that sum every non-TOTAL line stay right
    (`on_demand_cost_usd` stays the on-demand equivalent)."""

    def to_csv(self) -> str:
        """One line per segment, then a TOTAL line (cost and on-demand cost rounded to cents)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.CSV_COLUMNS)
        for segment in self.segments:
            row = segment.to_dict()
            for kind in CAPACITY_TYPES:
                own = segment.lifecycle == kind
                row[f"{kind}_capacity_hours"] = row["hours"] if own else ""
                row[f"{kind}_capacity_cost_usd"] = row["cost_usd"] if own else ""
            writer.writerow(["" if row[c] is None else row[c] for c in self.CSV_COLUMNS])
        split = [value for kind in CAPACITY_TYPES
                 for value in (str(self.by_capacity_type[kind].hours.quantize(HOURS_Q)),
                               _usd(self.by_capacity_type[kind].cost))]
        writer.writerow(["TOTAL", "", "", "", "", "", "", self.as_of.isoformat(),
                         str(self.billed_hours.quantize(HOURS_Q)), "", "", _usd(self.total),
                         _usd(self.on_demand_equivalent), *split])
        return out.getvalue()


def job_cost_report(*, job: TrainingJob, as_of: datetime | None = None) -> CostReport:
    """Build the cost report of `job` from its billing segments and reconfigurations."""
    as_of = as_of or timezone.now()
    report = CostReport(job_id=job.pk, job_name=job.name, as_of=as_of)
    segments = list(
        BillingSegment.objects.filter(job=job).select_related("instance__instance_type", "instance__zone")
        .order_by("start", "instance_id", "id")
    )
    for seg in segments:
        end = seg.end if seg.end is not None else max(as_of, seg.start)
        hours = exact_hours(end - seg.start)
        cost = seg.price_per_hour * hours
        on_demand_cost = seg.on_demand_price_per_hour * hours
        instance = seg.instance
        zone = (instance.zone.zone_id or instance.zone.code) if instance.zone else ""
        report.segments.append(SegmentCost(
            segment_id=seg.pk, instance_id=instance.pk, provider_instance_id=instance.provider_instance_id or "",
            instance_type=instance.instance_type.name, zone=zone, lifecycle=instance.lifecycle, start=seg.start,
            end=seg.end, hours=hours, price_per_hour=seg.price_per_hour, price_source=seg.price_source,
            cost=cost, on_demand_cost=on_demand_cost,
        ))
        report.total += cost
        report.billed_hours += hours
        report.on_demand_equivalent += on_demand_cost
        for table, key in ((report.by_instance_type, instance.instance_type.name), (report.by_zone, zone)):
            entry = table.setdefault(key, Breakdown(key=key))
            entry.segments += 1
            entry.hours += hours
            entry.cost += cost
            entry.on_demand_cost += on_demand_cost
        # An instance's lifecycle is fixed for its life, so each segment is wholly one type.
        capacity = report.by_capacity_type.setdefault(instance.lifecycle, CapacityLine())
        capacity.segments += 1
        capacity.hours += hours
        capacity.cost += cost
    report.by_instance_type = dict(sorted(report.by_instance_type.items()))
    report.by_zone = dict(sorted(report.by_zone.items()))

    # Spend rate at each reconfiguration, from the segments already in memory.
    rate_cache: dict[datetime, Decimal] = {}
    # The job's reconfigurations through its relation: billing sits below jobs and imports none of it.
    for reconf in job.reconfigurations.filter(lost_seconds__gt=0, decided_at__lte=as_of):
        t = reconf.decided_at
        if t not in rate_cache:
            rate_cache[t] = sum(
                (s.price_per_hour for s in segments if s.start <= t and (s.end is None or s.end > t)), Decimal(0)
            )
        lost = Decimal(repr(reconf.lost_seconds))
        report.preemption_lost_seconds += reconf.lost_seconds
        report.preemption_loss += lost / SECONDS_PER_HOUR * rate_cache[t]
        report.preemption_events += 1
    return report


# --- a team's spend over a window, per UTC day and per job -----------------------------------------

NO_JOB = "(no job)"
MAX_SPEND_DAYS = 366
"""The longest window a spend report covers (UTC days, both ends included)."""


def spend_window_problem(start: date, end: date) -> str | None:
    """Why [start, end] (UTC days, both included) cannot be a spend report's window, or None: the
    one rule the API and the dashboard's download both apply (the message names `end`)."""
    if end >= date.max:  # the window runs until the midnight after `end`, which must be a date
        return f"end must be before {date.max}"
    if end < start:
        return f"end ({end}) must not be before start ({start})"
    if (end - start).days + 1 > MAX_SPEND_DAYS:
        return f"at most {MAX_SPEND_DAYS} days from start"
    return None



@dataclass(slots=True)
class SpendLine:
    """Hours, cost and on-demand cost of one day, one job, or one (day, job) cell."""

    hours: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)
    on_demand_cost: Decimal = Decimal(0)

    def add(self, hours: Decimal, price: Decimal, on_demand_price: Decimal) -> None:
        self.hours += hours
        self.cost += price * hours
        self.on_demand_cost += on_demand_price * hours

    def to_dict(self) -> dict[str, Any]:
        return {"hours": str(self.hours.quantize(HOURS_Q)), "cost_usd": _usd(self.cost),
                "on_demand_cost_usd": _usd(self.on_demand_cost)}


@dataclass(slots=True)
class TeamSpendReport:
    """What a team's instances cost in [start, end): per UTC day (every day listed, 0 when idle),
    per job (instances bought for no job under `job: null`), and per (day, job) for the CSV.
    Segments are clipped to the window and split at midnight UTC; open ones run until `as_of`."""

    team_id: int
    team_slug: str
    start: datetime
    end: datetime
    as_of: datetime
    total: SpendLine = field(default_factory=SpendLine)
    days: dict[datetime, SpendLine] = field(default_factory=dict)
    jobs: dict[int | None, SpendLine] = field(default_factory=dict)
    job_names: dict[int | None, str] = field(default_factory=dict)
    cells: dict[tuple[datetime, int | None], SpendLine] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "team": self.team_id, "team_slug": self.team_slug, "start": self.start.isoformat(),
            "end": self.end.isoformat(), "as_of": self.as_of.isoformat(), "currency": "USD",
            "total_usd": _usd(self.total.cost), "billed_hours": str(self.total.hours.quantize(HOURS_Q)),
            "on_demand_equivalent_usd": _usd(self.total.on_demand_cost),
            "savings_usd": _usd(self.total.on_demand_cost - self.total.cost),
            "by_day": [{"day": day.date().isoformat(), **line.to_dict()} for day, line in self.days.items()],
            "by_job": [{"job": job, "job_name": self.job_names.get(job, NO_JOB), **line.to_dict()}
                       for job, line in sorted(self.jobs.items(), key=lambda kv: (-kv[1].cost, kv[0] or 0))],
        }

    CSV_COLUMNS = ("day", "job", "job_name", "hours", "cost_usd", "on_demand_cost_usd")

    def to_csv(self) -> str:
        """One line per (day, job) with spend, in day then job order, then a TOTAL line."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.CSV_COLUMNS)
        for (day, job), line in sorted(self.cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            row = line.to_dict()
            writer.writerow([day.date().isoformat(), "" if job is None else job, self.job_names.get(job, NO_JOB),
                             row["hours"], row["cost_usd"], row["on_demand_cost_usd"]])
        total = self.total.to_dict()
        writer.writerow(["TOTAL", "", "", total["hours"], total["cost_usd"], total["on_demand_cost_usd"]])
        return out.getvalue()


def _midnight(at: datetime) -> datetime:
    return at.replace(hour=0, minute=0, second=0, microsecond=0)


def _days(start: datetime, end: datetime) -> list[datetime]:
    """Every UTC midnight from start's day up to end."""
    days, day = [], _midnight(start)
    while day < end:
        days.append(day)
        day += timedelta(days=1)
    return days


def _day_pieces(
    seg_start: datetime, seg_end: datetime | None, start: datetime, end: datetime, as_of: datetime
) -> Iterator[tuple[datetime, Decimal]]:
    """A segment's hours inside [start, end), split at midnight UTC; an open one runs until as_of."""
    stop = min(seg_end if seg_end is not None else max(as_of, seg_start), end)
    cursor = max(seg_start, start)
    while cursor < stop:
        day = _midnight(cursor)
        piece_end = min(stop, day + timedelta(days=1))
        yield day, exact_hours(piece_end - cursor)
        cursor = piece_end


def teams_daily_spend(
    *, team_ids: Iterable[int], start: datetime, end: datetime, as_of: datetime | None = None
) -> dict[datetime, SpendLine]:
    """What the teams' instances cost per UTC day in [start, end), every day listed (0 when idle),
    by the same rule as `team_spend_report` (the dashboard's overview, across a user's teams)."""
    as_of = as_of or timezone.now()
    days = {day: SpendLine() for day in _days(start, end)}
    rows = (
        BillingSegment.objects.filter(team_id__in=list(team_ids), start__lt=end).exclude(end__lte=start)
        .values_list("start", "end", "price_per_hour", "on_demand_price_per_hour")
    )
    for seg_start, seg_end, price, on_demand_price in rows:
        for day, hours in _day_pieces(seg_start, seg_end, start, end, as_of):
            days.setdefault(day, SpendLine()).add(hours, price, on_demand_price)
    return days


def team_spend_report(*, team: Any, start: datetime, end: datetime, as_of: datetime | None = None) -> TeamSpendReport:
    """Build `team`'s spend report over [start, end) (aware datetimes, normally midnights UTC)."""
    as_of = as_of or timezone.now()
    report = TeamSpendReport(team_id=team.pk, team_slug=team.slug, start=start, end=end, as_of=as_of)
    report.days = {day: SpendLine() for day in _days(start, end)}
    rows = (
        BillingSegment.objects.filter(team_id=team.pk, start__lt=end).exclude(end__lte=start)
        .values_list("job_id", "job__name", "start", "end", "price_per_hour", "on_demand_price_per_hour")
        .order_by("start", "id")
    )
    for job_id, job_name, seg_start, seg_end, price, on_demand_price in rows:
        report.job_names.setdefault(job_id, job_name or NO_JOB)
        for day, hours in _day_pieces(seg_start, seg_end, start, end, as_of):
            for line in (report.total, report.days.setdefault(day, SpendLine()),
                         report.jobs.setdefault(job_id, SpendLine()),
                         report.cells.setdefault((day, job_id), SpendLine())):
                line.add(hours, price, on_demand_price)
    return report
