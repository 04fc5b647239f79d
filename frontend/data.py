"""The JSON data endpoints, one per page (Zulip's /stats pattern): the shell page loads, then its
script fetches the page's endpoint and plotly.js draws the series. Each endpoint is scoped to the
user's teams, answers 400 naming the bad parameter, and 404 for another team's job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils import timezone

from controlplane.billing.reports import job_cost_report
from controlplane.fleet.models import NoticeStatus
from frontend import costs, selectors
from frontend.access import admin_team_ids, data_endpoint, job_for_request, visible_team_ids

MAX_PRICE_DAYS = 365
DEFAULT_PRICE_DAYS = 14
DEFAULT_POOLS = 3
MAX_POOLS = 8


def _bad(field: str, message: str) -> JsonResponse:
    return JsonResponse({"detail": message, "errors": {field: [message]}}, status=400)


@data_endpoint
def overview_data(request: HttpRequest) -> dict[str, Any]:
    return selectors.overview(team_ids=visible_team_ids(request), now=timezone.now())


@data_endpoint
def prices_data(request: HttpRequest) -> dict[str, Any] | HttpResponse:
    """`?pool=<type id>-<zone id>` (repeat to compare, default the cheapest few) and `?days=N`."""
    raw_days = request.GET.get("days", str(DEFAULT_PRICE_DAYS))
    try:
        days = float(raw_days)
    except ValueError:
        return _bad("days", f"days must be a number of days, got {raw_days!r}")
    if not 0 < days <= MAX_PRICE_DAYS:
        return _bad("days", f"days must be in (0, {MAX_PRICE_DAYS}], got {raw_days}")
    now = timezone.now()
    pools = selectors.pools_now(at=now)
    by_key = {pool.key: pool for pool in pools}
    wanted = request.GET.getlist("pool")
    if len(wanted) > MAX_POOLS:
        return _bad("pool", f"at most {MAX_POOLS} pools at once, got {len(wanted)}")
    unknown = [key for key in wanted if key not in by_key]
    if unknown:
        return _bad("pool", f"unknown pool {unknown[0]!r}; expected '<instance type id>-<zone id>' of a priced pool")
    chosen = [by_key[key] for key in dict.fromkeys(wanted)] or pools[:DEFAULT_POOLS]
    team_ids = visible_team_ids(request)
    interruptions = selectors.interruption_buckets(team_ids=team_ids, since=now - timedelta(days=30))

    def describe(pool: selectors.PoolNow) -> dict[str, Any]:
        observed = interruptions.get((pool.instance_type_id, pool.zone_id))
        savings = None
        if pool.on_demand:
            savings = str(((1 - pool.price / pool.on_demand) * 100).quantize(costs.Decimal("0.1")))
        return {"key": pool.key, "name": pool.label, "instance_type": pool.instance_type, "zone": pool.zone,
                "price": str(pool.price), "since": selectors.iso(pool.since),
                "on_demand": None if pool.on_demand is None else str(pool.on_demand), "savings_pct": savings,
                "interruption": observed}

    history = selectors.price_series(pools=chosen, start=now - timedelta(days=days), end=now)
    return {
        "generated_at": selectors.iso(now),
        "days": days,
        "selected": [pool.key for pool in chosen],
        "available": [{"key": p.key, "name": p.label} for p in sorted(pools, key=lambda p: p.label)],
        "cheapest": [describe(pool) for pool in pools[:10]],
        "selected_pools": [describe(pool) for pool in chosen],
        **history,
    }


def _action_urls(rows: list[dict[str, Any]], *, key: str, route: str, admin_ids: set[int],
                 when: Callable[[dict[str, Any]], bool] = lambda row: True) -> None:
    """Give each row the URL of the page action its user may take (`key`: None when they may not):
    the buttons' only source, so a member is never offered what the view would refuse."""
    for row in rows:
        allowed = row["team_id"] in admin_ids and when(row)
        row[key] = reverse(route, args=[row["id"]]) if allowed else None


@data_endpoint
def fleet_data(request: HttpRequest) -> dict[str, Any]:
    data = selectors.fleet(team_ids=visible_team_ids(request), now=timezone.now())
    _action_urls(data["live_instances"], key="terminate_url", route="frontend:instance-terminate",
                 admin_ids=set(admin_team_ids(request)))
    return data


@data_endpoint
def jobs_data(request: HttpRequest) -> dict[str, Any]:
    now = timezone.now()
    return {"generated_at": selectors.iso(now), "jobs": selectors.job_rows(team_ids=visible_team_ids(request), now=now)}


@data_endpoint
def job_data(request: HttpRequest, job_id: int) -> dict[str, Any] | HttpResponse:
    """`?events_page=N` (1 = newest) and `?events_kind=<kind>` choose the timeline's page."""
    job = job_for_request(request, job_id)
    raw_page = request.GET.get("events_page", "1")
    if not (raw_page.isascii() and raw_page.isdigit()) or not 1 <= int(raw_page) <= 1_000_000:
        return _bad("events_page", f"events_page must be a page number from 1, got {raw_page[:40]!r}")
    kind = request.GET.get("events_kind", "")
    if len(kind) > 40 or "\x00" in kind:
        return _bad("events_kind", "events_kind must be an event kind (at most 40 characters)")
    return selectors.job_detail(job=job, now=timezone.now(), events_page=int(raw_page), events_kind=kind or None)


@data_endpoint
def job_cost_data(request: HttpRequest, job_id: int) -> dict[str, Any]:
    """Billing's cost report plus the page's per-pool and per-preemption views."""
    job = job_for_request(request, job_id)
    return costs.job_cost_page(job=job)


# The downloads are billing's report exactly as the API serves it (/api/v1/jobs/<id>/cost-report/).


@data_endpoint
def job_cost_csv(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for_request(request, job_id)
    response = HttpResponse(job_cost_report(job=job).to_csv(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-cost.csv"'
    return response


@data_endpoint
def job_cost_json_download(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for_request(request, job_id)
    response = JsonResponse(job_cost_report(job=job).to_dict(), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-cost.json"'
    return response


@data_endpoint
def notices_data(request: HttpRequest) -> dict[str, Any]:
    data = selectors.notices(team_ids=visible_team_ids(request))
    _action_urls(data["rows"], key="retry_url", route="frontend:notice-retry", admin_ids=set(admin_team_ids(request)),
                 when=lambda row: row["status"] == NoticeStatus.FAILED)
    return {"generated_at": selectors.iso(timezone.now()), **data}
