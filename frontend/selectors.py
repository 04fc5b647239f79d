"""Reads behind the dashboard's data endpoints. Every function takes the requester's `team_ids`
(or an already scoped job) so nothing here can leak another team's rows; prices are the only
global data. Each returns plain JSON-ready structures; the views only wrap them.

Queries are shaped for big tables: price history is downsampled in the database
(`market.selectors.spot_price_history(bucket_seconds=...)`), metric curves are grouped by step
buckets on the (job, step) index, and "price now" per pool is one index probe per pool."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Count, Max, OuterRef, Q, Subquery

from controlplane.billing.reports import teams_daily_spend
from controlplane.fleet.models import Instance, InstanceEvent, InterruptionNotice, NoticeKind
from controlplane.fleet.states import LIVE_STATES, InstanceState
from controlplane.jobs.models import (
    ACTIVE_JOB_STATUSES,
    JobEvent,
    JobGeneration,
    MetricSample,
    Reconfiguration,
    TrainingJob,
)
from controlplane.market import rollup
from controlplane.market.selectors import LINUX, PricePoint, cheapest_pools, spot_price_at, spot_price_history
from controlplane.orchestration.offerings import unavailable_offerings_for_teams
from frontend import costs

# Buckets a chart may use, so axes line up between pools and requests cache well.
NICE_BUCKETS = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
MAX_PRICE_POINTS = 400
MAX_METRIC_POINTS = 600
MAX_POOLS_LISTED = 500
PRICE_QUANTUM = Decimal("0.000001")  # prices are stored to the micro-dollar
MAX_TIMELINE_NOTICES = 500
INTERRUPTION_BUCKETS = ((5, "<5%"), (10, "5-10%"), (15, "10-15%"), (20, "15-20%"), (math.inf, ">20%"))


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def num(value: Decimal | float | None) -> float | None:
    """A JSON number for charts (money in tables stays a string)."""
    return None if value is None else float(value)


def bucket_seconds_for(span: timedelta, max_points: int = MAX_PRICE_POINTS) -> int:
    """The smallest nice bucket that keeps a series of `span` under `max_points` points."""
    wanted = span.total_seconds() / max_points
    return next((b for b in NICE_BUCKETS if b >= wanted), NICE_BUCKETS[-1])


# --- Prices ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolNow:
    """A spot pool with the price in force now."""

    instance_type_id: int
    instance_type: str
    zone_id: int
    zone: str
    price: Decimal
    since: datetime
    on_demand: Decimal | None

    @property
    def key(self) -> str:
        return f"{self.instance_type_id}-{self.zone_id}"

    @property
    def label(self) -> str:
        return f"{self.instance_type} {self.zone}"


def pools_now(*, at: datetime, product: str = LINUX, limit: int = MAX_POOLS_LISTED) -> list[PoolNow]:
    """Every pool with a known price at `at`, cheapest first (`market.selectors.cheapest_pools`:
    one row per pool from SpotPool, never a scan of the price history)."""
    return [
        PoolNow(instance_type_id=p.instance_type_id, instance_type=p.instance_type, zone_id=p.zone_id, zone=p.zone,
                price=Decimal(p.price).quantize(PRICE_QUANTUM), since=p.since, on_demand=p.on_demand_price)
        for p in cheapest_pools(at=at, product=product, limit=limit)
    ]


def interruption_buckets(*, team_ids: Iterable[int], since: datetime) -> dict[tuple[int, int], dict[str, Any]]:
    """Observed interruption frequency per pool from the teams' own instances launched since
    `since`: the share of them that were preempted or got a notice, in the spot advisor's buckets."""
    rows = (
        Instance.objects.filter(team_id__in=list(team_ids), created_at__gte=since, zone__isnull=False)
        .values("instance_type_id", "zone_id")
        .annotate(
            total=Count("id"),
            interrupted=Count("id", filter=Q(state=InstanceState.PREEMPTED) | Q(notice_at__isnull=False)),
        )
    )
    result = {}
    for row in rows:
        pct = 100.0 * row["interrupted"] / row["total"]
        label = next(name for limit, name in INTERRUPTION_BUCKETS if pct < limit)
        result[(row["instance_type_id"], row["zone_id"])] = {
            "bucket": label, "observed_pct": round(pct, 1), "instances": row["total"],
            "interrupted": row["interrupted"],
        }
    return result


def price_series(
    *, pools: list[PoolNow], start: datetime, end: datetime, max_points: int = MAX_PRICE_POINTS
) -> dict[str, Any]:
    """Downsampled price history of `pools` in [start, end) plus each instance type's on-demand
    price. Each series starts with the price in force at `start`, so a step line begins at the left
    edge even when the pool did not change for days."""
    bucket = bucket_seconds_for(end - start, max_points)
    from_rollup = bucket % 3600 == 0
    rolled: dict[tuple[int, int], list] = {}
    if from_rollup:
        # Hour-multiple buckets come from the hourly roll-up: thousands of rows, not millions.
        rollup.price_rollup_refresh()
        rolled = rollup.hourly_buckets(pools=[(p.instance_type_id, p.zone_id) for p in pools], product=LINUX,
                                       start=start, end=end, bucket_seconds=bucket)
    series = []
    for pool in pools:
        if from_rollup:
            points = [PricePoint(at=at, price=mean, min=low, max=high, count=n)
                      for at, mean, low, high, n in rolled[(pool.instance_type_id, pool.zone_id)]]
        else:
            points = spot_price_history(
                instance_type=pool.instance_type_id, zone=pool.zone_id, start=start, end=end, bucket_seconds=bucket
            )
        x: list[str | None] = []
        y: list[float | None] = []
        low: list[float | None] = []
        high: list[float | None] = []
        opening = spot_price_at(instance_type=pool.instance_type_id, zone=pool.zone_id, at=start)
        if opening is not None and (not points or points[0].at > start):
            x.append(iso(start))
            y.append(num(opening))
            low.append(num(opening))
            high.append(num(opening))
        for point in points:
            x.append(iso(point.at))
            y.append(num(point.price))
            low.append(num(point.min))
            high.append(num(point.max))
        if y:
            # Hold the last value to the right edge (the price is in force until it changes).
            x.append(iso(end))
            y.append(y[-1])
            low.append(y[-1])
            high.append(y[-1])
        series.append({"key": pool.key, "name": pool.label, "instance_type": pool.instance_type,
                       "zone": pool.zone, "x": x, "y": y, "min": low, "max": high,
                       "changes": sum(p.count for p in points)})
    on_demand = []
    for name, price in sorted({(p.instance_type, p.on_demand) for p in pools if p.on_demand is not None}):
        on_demand.append({"name": f"{name} on-demand", "instance_type": name, "x": [iso(start), iso(end)],
                          "y": [num(price), num(price)]})
    return {"bucket_seconds": bucket, "source": "hourly roll-up" if from_rollup else "price table",
            "start": iso(start), "end": iso(end), "series": series, "on_demand": on_demand}


# --- Overview and fleet ----------------------------------------------------------------------------


def nodes_by_state(*, team_ids: Iterable[int]) -> dict[str, int]:
    counts = dict(
        Instance.objects.filter(team_id__in=list(team_ids)).values_list("state").annotate(n=Count("id")).order_by()
    )
    return {state: counts.get(state, 0) for state in InstanceState.values}


def overview(*, team_ids: list[int], now: datetime) -> dict[str, Any]:
    """Running jobs, nodes by state, spend rate now, spend and savings this month (daily bars)."""
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    rate = costs.team_spend_rate(team_ids=team_ids)
    daily = list(teams_daily_spend(team_ids=team_ids, start=month_start, end=now, as_of=now).items())
    month_cost = sum((spend.cost for _, spend in daily), Decimal(0))
    month_on_demand = sum((spend.on_demand_cost for _, spend in daily), Decimal(0))
    active = list(
        TrainingJob.objects.filter(team_id__in=team_ids, status__in=ACTIVE_JOB_STATUSES)
        .order_by("-created_at", "-id")
        .values("id", "name", "status", "steps_done", "target_steps", "team__slug")[:20]
    )
    for job in active:
        job["progress"] = round(job["steps_done"] / job["target_steps"], 4) if job["target_steps"] else 0
    return {
        "generated_at": iso(now),
        "running_jobs": active,
        "nodes_by_state": nodes_by_state(team_ids=team_ids),
        "spend_rate_per_hour": costs.money(rate.cost),
        "on_demand_rate_per_hour": costs.money(rate.on_demand),
        "month": {"start": iso(month_start), "cost": costs.money(month_cost),
                  "on_demand_equivalent": costs.money(month_on_demand),
                  "savings": costs.money(month_on_demand - month_cost)},
        "daily": {
            "x": [iso(day) for day, _ in daily],
            "cost": [num(spend.cost.quantize(costs.MONEY)) for _, spend in daily],
            "savings": [num((spend.on_demand_cost - spend.cost).quantize(costs.MONEY)) for _, spend in daily],
        },
    }


def fleet(*, team_ids: list[int], now: datetime, window: timedelta = timedelta(days=7)) -> dict[str, Any]:
    """Instances by state, zone and type, and a timeline of notices and preemptions."""
    since = now - window
    grouped = (
        Instance.objects.filter(team_id__in=team_ids)
        .filter(Q(state__in=LIVE_STATES) | Q(ended_at__gte=since) | Q(created_at__gte=since))
        .values_list("state", "zone__code", "instance_type__name")
        .annotate(n=Count("id"))
        .order_by()
    )
    by_state: Counter[str] = Counter()
    by_zone: dict[str, Counter[str]] = defaultdict(Counter)
    by_type: dict[str, Counter[str]] = defaultdict(Counter)
    for state, zone, type_name, n in grouped:
        by_state[state] += n
        by_zone[zone or "-"][state] += n
        by_type[type_name][state] += n
    states = [s for s in InstanceState.values if by_state[s]]
    zones, types = sorted(by_zone), sorted(by_type)
    in_window = InterruptionNotice.objects.filter(team_id__in=team_ids, received_at__gte=since)
    # The newest ones only: a storm of notices would otherwise make the page heavy to load and draw.
    notices = list(
        in_window.order_by("-received_at", "-id")
        .values("received_at", "kind", "source", "provider_instance_id", "status")[:MAX_TIMELINE_NOTICES]
    )[::-1]
    notices_total = len(notices) if len(notices) < MAX_TIMELINE_NOTICES else in_window.count()
    preemptions = list(
        InstanceEvent.objects.filter(instance__team_id__in=team_ids, at__gte=since, to_state=InstanceState.PREEMPTED)
        .order_by("at", "id")
        .values("at", "instance__provider_instance_id", "instance__instance_type__name", "instance__zone__code")[:2000]
    )
    timeline = []
    for kind in NoticeKind.values:
        rows = [n for n in notices if n["kind"] == kind]
        if rows:
            timeline.append({"name": f"notice: {kind}", "x": [iso(n["received_at"]) for n in rows],
                             "text": [f"{n['provider_instance_id']} via {n['source']} ({n['status']})" for n in rows]})
    if preemptions:
        timeline.append({"name": "preempted", "x": [iso(p["at"]) for p in preemptions],
                         "text": [f"{p['instance__provider_instance_id']} {p['instance__instance_type__name']} "
                                  f"{p['instance__zone__code'] or ''}" for p in preemptions]})
    live = list(
        Instance.objects.filter(team_id__in=team_ids, state__in=LIVE_STATES)
        .order_by("-created_at", "-id")
        .values("id", "team_id", "provider_instance_id", "state", "instance_type__name", "zone__code", "lifecycle",
                "job_id", "job__name", "last_heartbeat_at")[:200]
    )
    for row in live:
        row["last_heartbeat_at"] = iso(row["last_heartbeat_at"])
    return {
        "generated_at": iso(now), "window_start": iso(since), "states": states,
        "by_state": {"x": states, "y": [by_state[s] for s in states]},
        "by_zone": {"x": zones, "series": [{"name": s, "y": [by_zone[z][s] for z in zones]} for s in states]},
        "by_type": {"x": types, "series": [{"name": s, "y": [by_type[t][s] for t in types]} for s in states]},
        "timeline": timeline,
        "timeline_notices": {"shown": len(notices), "total": notices_total},
        "live_instances": live,
        "unavailable_offerings": [u.to_dict() for u in unavailable_offerings_for_teams(team_ids=team_ids, now=now)],
    }


def notices(*, team_ids: list[int], limit: int = 200) -> dict[str, Any]:
    """The newest notices with source, status and processing time."""
    rows = list(
        InterruptionNotice.objects.filter(team_id__in=team_ids)
        .order_by("-received_at", "-id")
        .values("id", "team_id", "source", "kind", "action", "provider_instance_id", "instance_id", "unknown_instance",
                "received_at", "processed_at", "status", "attempts", "error", "deadline")[:limit]
    )
    for row in rows:
        done = row["processed_at"]
        row["processing_ms"] = round((done - row["received_at"]).total_seconds() * 1000, 1) if done else None
        for key in ("received_at", "processed_at", "deadline"):
            row[key] = iso(row[key])
        row["error"] = row["error"][:200]
    timed = [r for r in reversed(rows) if r["processing_ms"] is not None]
    sources = sorted({r["source"] for r in timed})
    return {
        "rows": rows,
        "by_status": dict(Counter(r["status"] for r in rows)),
        "processing": [
            {"name": source, "x": [r["received_at"] for r in timed if r["source"] == source],
             "y": [r["processing_ms"] for r in timed if r["source"] == source]}
            for source in sources
        ],
    }


# --- Jobs ------------------------------------------------------------------------------------------


def job_rows(*, team_ids: list[int], now: datetime, limit: int = 200) -> list[dict[str, Any]]:
    """Jobs with status, progress, last throughput and cost so far, newest first."""
    # The newest sample that measured a speed: a validation pass's sample has none.
    latest = MetricSample.objects.filter(job_id=OuterRef("pk"), samples_per_s__isnull=False).order_by("-step", "-id")
    jobs = list(
        TrainingJob.objects.filter(team_id__in=team_ids)
        .annotate(throughput=Subquery(latest.values("samples_per_s")[:1]))
        .order_by("-created_at", "-id")
        .values("id", "name", "status", "strategy", "steps_done", "target_steps", "last_loss", "throughput",
                "budget_usd", "deadline", "created_at", "team__slug")[:limit]
    )
    spent = costs.job_costs_so_far(job_ids=[j["id"] for j in jobs], now=now)
    for job in jobs:
        job["progress"] = round(job["steps_done"] / job["target_steps"], 4) if job["target_steps"] else 0
        job["cost_so_far"] = costs.money(spent.get(job["id"], costs.ZERO))
        job["budget_usd"] = None if job["budget_usd"] is None else str(job["budget_usd"])
        job["deadline"] = iso(job["deadline"])
        job["created_at"] = iso(job["created_at"])
    return jobs


def job_metric_curves(*, job: TrainingJob, max_points: int = MAX_METRIC_POINTS) -> dict[str, Any]:
    """Loss and throughput by step, and the validation loss by step. A long run is sampled at every
    `stride`-th step (and its last step), as TensorBoard samples scalars: one index probe per point on
    (job, step), so the cost follows the points drawn, not the length of the run. Several samples of
    one step (one per worker) are averaged.

    The validation loss is its own series (`val_step`, `val_loss`, `job_val_curve`): its steps are
    every `val_every`-th, which a stride would mostly miss. A validation pass's samples (no loss, no
    speed) add no point to the training curves, so a step whose training samples are not stored yet
    does not draw a gap in them."""
    samples = MetricSample.objects.filter(job_id=job.pk)
    val = job_val_curve(job=job, max_points=max_points)
    last_step = samples.aggregate(m=Max("step"))["m"]
    if last_step is None:
        return {"stride": 1, "step": [], "loss": [], "samples_per_s": [], "at": [], "last_step": None, **val}
    stride = max(1, math.ceil((last_step + 1) / max_points))
    if stride > 1:
        samples = samples.filter(step__in=sorted({*range(0, last_step + 1, stride), last_step}))
    grouped: dict[int, list] = {}
    for step, loss, speed, at in samples.order_by("step", "id").values_list("step", "loss", "samples_per_s", "at"):
        if loss is None and speed is None:
            continue  # a validation pass's sample: its own series
        entry = grouped.setdefault(step, [[], [], at])
        if loss is not None:
            entry[0].append(loss)
        if speed is not None:
            entry[1].append(speed)
        entry[2] = max(entry[2], at)

    steps = sorted(grouped)
    return {
        "stride": stride,
        "step": steps,
        "loss": [_mean(grouped[s][0], 6) for s in steps],
        "samples_per_s": [_mean(grouped[s][1], 3) for s in steps],
        "at": [iso(grouped[s][2]) for s in steps],
        "last_step": last_step,
        **val,
    }


def _mean(values: list[float], digits: int) -> float | None:
    return round(sum(values) / len(values), digits) if values else None


def job_val_curve(*, job: TrainingJob, max_points: int = MAX_METRIC_POINTS) -> dict[str, Any]:
    """The validation loss by step (`val_step`, `val_loss`; the nodes' samples of one pass averaged),
    at most `max_points` passes: every k-th and the last, when there are more."""
    passes = dict(
        MetricSample.objects.filter(job_id=job.pk, val_loss__isnull=False)
        .values("step").annotate(mean=Avg("val_loss")).order_by("step").values_list("step", "mean")
    )
    steps = sorted(passes)
    if len(steps) > max_points:
        every = math.ceil(len(steps) / max_points)
        steps = sorted({*steps[::every], steps[-1]})
    return {"val_step": steps, "val_loss": [round(passes[s], 6) for s in steps]}


def _member_instance_ids(generations: list[JobGeneration]) -> set[int]:
    ids = set()
    for generation in generations:
        for member in generation.membership or []:
            if isinstance(member, dict) and isinstance(member.get("instance"), int):
                ids.add(member["instance"])
    return ids


def job_layouts(*, job: TrainingJob) -> list[dict[str, Any]]:
    """Each generation's pipeline layout as stages on nodes: cells (pipeline, stage) -> instance,
    with the nodes that failed (left before the next generation, or preempted) and the re-routed
    work (`layout["reroutes"]`: [{"from": instance id, "to": instance id, "micro_batches": n}])."""
    generations = list(JobGeneration.objects.filter(job_id=job.pk).order_by("number"))
    ids = _member_instance_ids(generations)
    instances = {
        row["id"]: row
        for row in Instance.objects.filter(pk__in=ids, team_id=job.team_id).values(
            "id", "provider_instance_id", "state", "instance_type__name", "zone__code"
        )
    }
    result = []
    for index, generation in enumerate(generations):
        following = generations[index + 1] if index + 1 < len(generations) else None
        next_ids = _member_instance_ids([following]) if following else None
        cells = []
        for member in generation.membership or []:
            if not isinstance(member, dict):
                continue
            instance_id = member.get("instance")
            info = instances.get(instance_id, {})
            left = next_ids is not None and instance_id not in next_ids
            failed = info.get("state") in (InstanceState.PREEMPTED, InstanceState.FAILED, InstanceState.NOTICE)
            cells.append({
                "instance": instance_id, "rank": member.get("rank"),
                "pipeline": member.get("pipeline", 0), "stage": member.get("stage", member.get("rank", 0)),
                "label": info.get("provider_instance_id") or f"instance {instance_id}",
                "instance_type": info.get("instance_type__name", ""), "zone": info.get("zone__code") or "",
                "state": info.get("state", "unknown"), "failed": bool(failed and (left or following is None)),
                "left": left,
            })
        layout = generation.layout or {}
        reroutes = [r for r in layout.get("reroutes", []) or [] if isinstance(r, dict)]
        entry = {
            "number": generation.number, "reason": generation.reason, "created_at": iso(generation.created_at),
            "dp": layout.get("dp"), "pp": layout.get("pp"), "stage_layers": layout.get("stage_layers"),
            "cells": cells, "reroutes": reroutes, "current": generation.number == job.current_generation,
        }
        entry["changes"] = _layout_changes(result[-1] if result else None, entry)
        result.append(entry)
    return result


def _layout_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What changed from one generation to the next, one short phrase each: the shape (dp, pp,
    layers per stage), the nodes that left and joined, and the re-routed work."""
    if before is None:
        return [f"{len(after['cells'])} node(s), dp={after['dp']} x pp={after['pp']}"]
    changes = [f"{key} {before[key]}→{after[key]}" for key in ("dp", "pp") if before[key] != after[key]]
    if before["stage_layers"] != after["stage_layers"]:
        changes.append(f"layers per stage {before['stage_layers']}→{after['stage_layers']}")
    old = {c["instance"]: c["label"] for c in before["cells"]}
    new = {c["instance"]: c["label"] for c in after["cells"]}
    left = [label for i, label in old.items() if i not in new]
    joined = [label for i, label in new.items() if i not in old]
    if left:
        changes.append("left: " + ", ".join(left))
    if joined:
        changes.append("joined: " + ", ".join(joined))
    if after["reroutes"]:
        changes.append(f"{len(after['reroutes'])} re-route(s)")
    places = {c["instance"]: (c["pipeline"], c["stage"]) for c in before["cells"]}
    moved = sum(1 for c in after["cells"]
                if c["instance"] in places and places[c["instance"]] != (c["pipeline"], c["stage"]))
    if moved:
        changes.append(f"{moved} node(s) moved stage")
    return changes or ["no change of layout"]


def job_prediction(*, job: TrainingJob, curves: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Predicted finish from the recent step rate (steps per wall-clock second over the last
    points of the curve), against the deadline."""
    steps, times = curves["step"], curves["at"]
    remaining = max(job.target_steps - job.steps_done, 0)
    prediction: dict[str, Any] = {"steps_done": job.steps_done, "target_steps": job.target_steps,
                                  "deadline": iso(job.deadline), "predicted_finish": None, "steps_per_hour": None,
                                  "on_time": None}
    if remaining == 0 and job.finished_at:
        prediction["predicted_finish"] = iso(job.finished_at)
    if len(steps) >= 2:
        tail = min(len(steps), 20)
        first_at = datetime.fromisoformat(times[-tail])
        last_at = datetime.fromisoformat(times[-1])
        seconds = (last_at - first_at).total_seconds()
        if seconds > 0 and steps[-1] > steps[-tail]:
            rate = (steps[-1] - steps[-tail]) / seconds
            prediction["steps_per_hour"] = round(rate * 3600, 2)
            if remaining:
                finish = max(now, last_at) + timedelta(seconds=remaining / rate)
                prediction["predicted_finish"] = iso(finish)
    if prediction["predicted_finish"] and job.deadline:
        prediction["on_time"] = datetime.fromisoformat(prediction["predicted_finish"]) <= job.deadline
    return prediction


EVENTS_PER_PAGE = 10


def job_events_page(*, job: TrainingJob, page: int = 1, kind: str | None = None) -> dict[str, Any]:
    """One page of the job's timeline, newest first, optionally of one kind, with the kinds the
    job has (and how many of each) for the filter. A page past the end gives the last page."""
    counts = dict(
        JobEvent.objects.filter(job_id=job.pk).values_list("kind").annotate(n=Count("id")).order_by("kind")
    )
    events = JobEvent.objects.filter(job_id=job.pk)
    if kind:
        events = events.filter(kind=kind)
    count = counts.get(kind, 0) if kind else sum(counts.values())
    pages = max(1, -(-count // EVENTS_PER_PAGE))
    page = min(max(page, 1), pages)
    offset = (page - 1) * EVENTS_PER_PAGE
    rows = list(events.order_by("-at", "-id").values("kind", "message", "at")[offset:offset + EVENTS_PER_PAGE])
    for row in rows:
        row["at"] = iso(row["at"])
    return {"rows": rows, "page": page, "pages": pages, "count": count, "per_page": EVENTS_PER_PAGE,
            "kind": kind or "", "kinds": [{"kind": k, "count": n} for k, n in counts.items()]}


def job_detail(*, job: TrainingJob, now: datetime, events_page: int = 1, events_kind: str | None = None
               ) -> dict[str, Any]:
    """Everything the job page plots: curves, layouts (each with what changed since the previous
    generation), the newest reconfigurations, one page of events, cost burn-down (with spot and
    on-demand hours and cost apart), the capacity policy and the predicted finish."""
    curves = job_metric_curves(job=job)
    cost_curve = costs.job_cost_curve(job=job, now=now)
    spent = cost_curve[-1][1] if cost_curve else costs.ZERO
    reconfigurations = list(
        Reconfiguration.objects.filter(job_id=job.pk)
        .order_by("decided_at", "id")
        .values("id", "trigger", "decision", "status", "from_generation", "to_generation", "decided_at",
                "applied_at", "lost_seconds", "instance__provider_instance_id")[:500]
    )
    for row in reconfigurations:
        row["decided_at"], row["applied_at"] = iso(row["decided_at"]), iso(row["applied_at"])
    prediction = job_prediction(job=job, curves=curves, now=now)
    # Burn-down: what the job will have cost at its predicted finish if it keeps today's nodes.
    rate = costs.job_spend_rate(job=job)
    projected = None
    if prediction["predicted_finish"] and job.finished_at is None:
        hours_left = max((datetime.fromisoformat(prediction["predicted_finish"]) - now).total_seconds(), 0) / 3600
        projected = num((spent + rate * Decimal(repr(hours_left))).quantize(costs.MONEY))
    events = job_events_page(job=job, page=events_page, kind=events_kind)
    return {
        "generated_at": iso(now),
        "job": {"id": job.pk, "name": job.name, "status": job.status, "status_message": job.status_message,
                "strategy": job.strategy, "steps_done": job.steps_done, "target_steps": job.target_steps,
                "current_generation": job.current_generation, "last_loss": job.last_loss,
                "last_val_loss": job.last_val_loss,
                "budget_usd": None if job.budget_usd is None else str(job.budget_usd),
                "deadline": iso(job.deadline), "started_at": iso(job.started_at),
                "finished_at": iso(job.finished_at), "capacity": job.capacity, "capacity_type": job.capacity_type,
                "deadline_unreachable_at": iso(job.deadline_unreachable_at)},
        "curves": curves,
        "layouts": job_layouts(job=job),
        "reconfigurations": reconfigurations,
        "events": events,
        "cost": {"x": [iso(at) for at, _ in cost_curve], "spent": [num(v.quantize(costs.MONEY)) for _, v in cost_curve],
                 "total": costs.money(spent), "budget": num(job.budget_usd),
                 "rate_per_hour": costs.money(rate), "projected_at_finish": projected,
                 "by_capacity_type": costs.job_capacity_split(job=job, now=now)},
        "prediction": prediction,
    }
