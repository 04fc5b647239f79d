"""Outbound alerts: teams register URLs; job status changes and budget thresholds are sent there as
Slack-compatible or generic JSON, signed with Standard Webhooks, retried with backoff.

Emitting only writes `AlertDelivery` rows and enqueues their delivery on commit, so a caller's
transaction never waits on somebody else's HTTP server. Callers: the job services call
`alert_job_status` when a job becomes recovering, recovered, failed or finished; billing calls
`alert_budget_threshold` when spending crosses a threshold."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import requests
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.models import Team
from controlplane.common.errors import DomainError
from controlplane.webhooks import signing
from controlplane.webhooks.models import AlertDelivery, AlertEndpoint, AlertEvent, AlertFormat, DeliveryStatus

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 3600.0
TIMEOUT_S = 5.0
USER_AGENT = "spotpipe-alerts/1"
JOB_STATUS_EVENTS = {
    "recovering": AlertEvent.JOB_RECOVERING, "recovered": AlertEvent.JOB_RECOVERED,
    "failed": AlertEvent.JOB_FAILED, "finished": AlertEvent.JOB_FINISHED,
}


def backoff_s(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): 5, 10, 20, ... capped at 1 h."""
    return min(BACKOFF_BASE_S * 2 ** max(attempt - 1, 0), BACKOFF_CAP_S)


@transaction.atomic
def alert_endpoint_create(
    *, team: Team, url: str, format: str = AlertFormat.GENERIC, events: list[str] | None = None,
    secret: str | None = None,
) -> AlertEndpoint:
    """Register an alert URL for `team`; its `signing_secret` is what the receiver verifies with."""
    if not url.startswith(("https://", "http://")):
        raise DomainError(f"url must be http(s), got {url[:80]!r}", field="url")
    if format not in AlertFormat.values:
        raise DomainError(f"format must be one of {', '.join(AlertFormat.values)}", field="format")
    unknown = sorted(set(events or []) - set(AlertEvent.values))
    if unknown:
        raise DomainError(f"unknown events {unknown}; expected some of {', '.join(AlertEvent.values)}", field="events")
    return AlertEndpoint.objects.create(
        team=team, url=url, format=format, events=list(events or []),
        signing_secret=secret or signing.generate_secret(),
    )


@transaction.atomic
def alert_emit(*, team_id: int, event: str, text: str, data: dict[str, Any]) -> list[AlertDelivery]:
    """Queue `event` for every active endpoint of the team that wants it; delivered on commit."""
    now = timezone.now()
    deliveries = []
    for endpoint in AlertEndpoint.objects.filter(team_id=team_id, active=True):
        if endpoint.events and event not in endpoint.events:
            continue
        payload = {"type": event, "timestamp": now.isoformat(), "text": text, "data": data}
        deliveries.append(AlertDelivery.objects.create(
            endpoint=endpoint, event=event, message_id=f"msg_{uuid.uuid4().hex}", payload=payload,
            next_attempt_at=now,
        ))
    if deliveries:
        ids = [d.pk for d in deliveries]

        def enqueue() -> None:
            from controlplane.webhooks.tasks import deliver_alert

            for delivery_id in ids:
                deliver_alert.delay(delivery_id)

        transaction.on_commit(enqueue)
    return deliveries


def alert_job_status(*, job, status: str, message: str = "") -> list[AlertDelivery]:
    """Alert on a job becoming recovering, recovered, failed or finished (other statuses: nothing)."""
    event = JOB_STATUS_EVENTS.get(status)
    if event is None:
        return []
    text = f"Job {job.name} (#{job.pk}) is {status}" + (f": {message}" if message else "")
    return alert_emit(team_id=job.team_id, event=event, text=text, data={
        "job": job.pk, "name": job.name, "status": status, "message": message, "steps_done": job.steps_done,
    })


def alert_budget_threshold(*, team_id: int, threshold_pct: int, spent_usd: str, budget_usd: str,
                           job=None) -> list[AlertDelivery]:
    """Alert that spending crossed `threshold_pct` of a budget (the job's, or the team's)."""
    scope = f"job {job.name} (#{job.pk})" if job is not None else "the team"
    text = f"Spending of {scope} crossed {threshold_pct}% of its budget: ${spent_usd} of ${budget_usd}"
    return alert_emit(team_id=team_id, event=AlertEvent.BUDGET_THRESHOLD, text=text, data={
        "job": job.pk if job is not None else None, "threshold_pct": threshold_pct, "spent_usd": str(spent_usd),
        "budget_usd": str(budget_usd),
    })


def alert_body(delivery: AlertDelivery) -> bytes:
    """The JSON sent: Slack's `{"text": ...}` or the generic `{type, timestamp, data}`."""
    payload = delivery.payload
    if delivery.endpoint.format == AlertFormat.SLACK:
        body = {"text": payload["text"]}
    else:
        body = {"type": payload["type"], "timestamp": payload["timestamp"], "data": payload["data"]}
    return json.dumps(body, separators=(",", ":")).encode()


def _post(url: str, *, data: bytes, headers: dict[str, str]) -> int:
    return requests.post(url, data=data, headers=headers, timeout=TIMEOUT_S, allow_redirects=False).status_code


def alert_deliver(*, delivery_id: int, post: Callable[..., int] = _post) -> str:
    """One delivery attempt. Returns "delivered", "retry" (5xx, 408, 429 or a network error, with
    `next_attempt_at` set by backoff), "failed" (other 4xx, or MAX_ATTEMPTS reached) or "skipped"."""
    with transaction.atomic():
        delivery = AlertDelivery.objects.select_for_update().select_related("endpoint").filter(pk=delivery_id).first()
        if delivery is None or delivery.status != DeliveryStatus.PENDING:
            return "skipped"
        delivery.attempts += 1
        delivery.save(update_fields=["attempts"])
    body = alert_body(delivery)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               **signing.signed_headers(secret=delivery.endpoint.signing_secret, msg_id=delivery.message_id,
                                        body=body)}
    status_code, error = None, ""
    try:
        status_code = post(delivery.endpoint.url, data=body, headers=headers)
    except requests.RequestException as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    now = timezone.now()
    delivery.last_status_code, delivery.last_error = status_code, error
    if status_code is not None and 200 <= status_code < 300:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at = DeliveryStatus.DELIVERED, now, None
        outcome = "delivered"
    elif status_code is not None and 400 <= status_code < 500 and status_code not in (408, 429):
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        delivery.last_error = delivery.last_error or f"receiver refused with {status_code}"
        outcome = "failed"
    elif delivery.attempts >= MAX_ATTEMPTS:
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        outcome = "failed"
    else:
        delivery.next_attempt_at = now + timedelta(seconds=backoff_s(delivery.attempts))
        outcome = "retry"
    delivery.save(update_fields=["status", "delivered_at", "next_attempt_at", "last_status_code", "last_error"])
    if outcome == "failed":
        logger.warning("alert %s to %s failed after %d attempts: %s", delivery.message_id, delivery.endpoint.url,
                       delivery.attempts, delivery.last_error or delivery.last_status_code)
    return outcome
