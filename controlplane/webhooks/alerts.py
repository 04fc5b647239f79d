"""Outbound alerts: teams register URLs; job status changes and budget thresholds are sent there as
Slack-compatible or generic JSON, signed with Standard Webhooks, retried with backoff.

Emitting only writes `AlertDelivery` rows and enqueues their delivery on commit, so a caller's
transaction never waits on somebody else's HTTP server. Callers: the job services call
`alert_job_status` when a job becomes recovering, recovered, failed or finished; billing calls
`alert_budget_threshold` when spending crosses a threshold.

The rows are the outbox: a delivery whose task was lost (the broker was down when it was enqueued
or retried, a worker died) stays PENDING with its `next_attempt_at`, and the beat task
`webhooks.sweep_alerts` sends it again once it is SWEEP_GRACE overdue (`alerts_sweep`)."""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.models import Team
from controlplane.common.errors import DomainError
from controlplane.webhooks import egress, signing
from controlplane.webhooks.models import AlertDelivery, AlertEndpoint, AlertEvent, AlertFormat, DeliveryStatus
from runtime.storable import unstorable

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 3600.0
TIMEOUT_S = 5.0
URL_MAX_LENGTH = 1000
# A pending delivery this far past its due time has lost its task; the sweep takes it and leaves
# it alone for SWEEP_LEASE while the new task waits in the queue.
SWEEP_GRACE = timedelta(seconds=60)
SWEEP_LEASE = timedelta(seconds=300)
SWEEP_BATCH = 200
ROTATION_GRACE_DEFAULT = timedelta(hours=24)
ROTATION_GRACE_MAX = timedelta(days=30)
USER_AGENT = "spotpipe-alerts/1"
JOB_STATUS_EVENTS = {
    "recovering": AlertEvent.JOB_RECOVERING, "recovered": AlertEvent.JOB_RECOVERED,
    "failed": AlertEvent.JOB_FAILED, "finished": AlertEvent.JOB_FINISHED, "stopped": AlertEvent.JOB_STOPPED,
}


def backoff_s(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): 5, 10, 20, ... capped at 1 h."""
    return min(BACKOFF_BASE_S * 2 ** max(attempt - 1, 0), BACKOFF_CAP_S)


def alert_url_check(url: str) -> str:
    """The URL an alert may go to: absolute http(s) with a host, no credentials in it (they would
    sit in clear in the database and in logs; the receiver checks our signature instead). The
    messages never repeat the URL, which may hold a secret."""
    url = (url or "").strip()
    if not url:
        raise DomainError("url is required", field="url")
    if len(url) > URL_MAX_LENGTH:
        raise DomainError(f"url is longer than {URL_MAX_LENGTH} characters", field="url")
    if any(ch.isspace() for ch in url):
        raise DomainError("url must not contain whitespace", field="url")
    if what := unstorable(url):
        raise DomainError(f"url contains {what}", field="url")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise DomainError("url must be http(s): http:// or https://", field="url")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise DomainError("url must not contain credentials (user:password@); the alert is signed instead",
                          field="url")
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise DomainError("url has an invalid port", field="url") from None
    if not parts.hostname:
        raise DomainError("url must name a host", field="url")
    if parts.fragment:
        raise DomainError("url must not have a #fragment", field="url")
    _check_destination(parts.hostname, parts.port)
    return url


def _check_destination(host: str, port: int | None) -> None:
    """Refuse a host that is, or resolves now to, a non-public address (egress.py). A name that
    does not resolve yet is accepted: every delivery checks again, after resolution."""
    if host == "localhost" or host.endswith(".localhost"):
        addresses = ["127.0.0.1", "::1"]
    else:
        try:
            addresses = egress.resolve(host, port)
        except (socket.gaierror, UnicodeError):
            return
    try:
        egress.check_host(host, addresses=addresses)
    except egress.EgressRefused as exc:
        raise DomainError(f"url must point to a public address: {exc}", field="url") from None


def _check_format(format: str) -> str:
    if format not in AlertFormat.values:
        raise DomainError(f"format must be one of {', '.join(AlertFormat.values)}", field="format")
    return format


def _check_events(events: list[str] | None) -> list[str]:
    unknown = sorted(set(events or []) - set(AlertEvent.values))
    if unknown:
        raise DomainError(f"unknown events {unknown}; expected some of {', '.join(AlertEvent.values)}", field="events")
    return list(dict.fromkeys(events or []))  # keep the order, drop repeats


@transaction.atomic
def alert_endpoint_create(
    *, team: Team, url: str, format: str = AlertFormat.GENERIC, events: list[str] | None = None,
    secret: str | None = None,
) -> AlertEndpoint:
    """Register an alert URL for `team`; its `signing_secret` is what the receiver verifies with."""
    return AlertEndpoint.objects.create(
        team=team, url=alert_url_check(url), format=_check_format(format), events=_check_events(events),
        signing_secret=secret or signing.generate_secret(),
    )


@transaction.atomic
def alert_endpoint_update(
    *, endpoint: AlertEndpoint, url: str | None = None, format: str | None = None,
    events: list[str] | None = None, active: bool | None = None,
) -> AlertEndpoint:
    """Change what an endpoint receives or where; the arguments left None stay as they are."""
    fields = []
    if url is not None:
        endpoint.url = alert_url_check(url)
        fields.append("url")
    if format is not None:
        endpoint.format = _check_format(format)
        fields.append("format")
    if events is not None:
        endpoint.events = _check_events(events)
        fields.append("events")
    if active is not None:
        endpoint.active = active
        fields.append("active")
    if fields:
        endpoint.save(update_fields=fields)
    return endpoint


@transaction.atomic
def alert_endpoint_rotate_secret(
    *, endpoint: AlertEndpoint, grace: timedelta = ROTATION_GRACE_DEFAULT
) -> AlertEndpoint:
    """Give the endpoint a new signing secret. Until `grace` has passed, every delivery carries a
    second signature made with the old secret, so the receiver may switch to the new secret at any
    time within the grace period without refusing an alert. A rotation during a grace period ends
    the older secret's grace at once (two signatures at most)."""
    if not timedelta(0) <= grace <= ROTATION_GRACE_MAX:
        raise DomainError(f"grace must be between 0 and {ROTATION_GRACE_MAX}", field="grace_hours")
    endpoint = AlertEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    now = timezone.now()
    endpoint.previous_signing_secret = endpoint.signing_secret if grace else ""
    endpoint.previous_secret_expires_at = now + grace if grace else None
    endpoint.signing_secret = signing.generate_secret()
    endpoint.secret_rotated_at = now
    endpoint.save(update_fields=["previous_signing_secret", "previous_secret_expires_at", "signing_secret",
                                 "secret_rotated_at"])
    return endpoint


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

            try:
                for delivery_id in ids:
                    deliver_alert.delay(delivery_id)
            except Exception as exc:  # the broker is down: the rows are the outbox, the sweep sends them
                logger.warning("could not enqueue %d alert deliveries (%s); the sweep sends them",
                               len(ids), type(exc).__name__)

        transaction.on_commit(enqueue)
    return deliveries


def alerts_sweep(*, now: datetime | None = None, limit: int = SWEEP_BATCH) -> list[int]:
    """Pending deliveries more than SWEEP_GRACE overdue (their task was lost): claim them for
    SWEEP_LEASE and return their ids for the caller to enqueue. A delivery sent twice (its old task
    turns up after all) carries the same `webhook-id`, so the receiver can drop the second."""
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            AlertDelivery.objects.select_for_update(skip_locked=True)
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now - SWEEP_GRACE)
            .order_by("next_attempt_at")
            .values_list("pk", flat=True)[:limit]
        )
        if ids:
            AlertDelivery.objects.filter(pk__in=ids).update(next_attempt_at=now + SWEEP_LEASE)
    return ids


def alert_job_status(*, job, status: str, message: str = "") -> list[AlertDelivery]:
    """Alert on a job becoming recovering, recovered, failed or finished (other statuses: nothing)."""
    event = JOB_STATUS_EVENTS.get(status)
    if event is None:
        return []
    text = f"Job {job.name} (#{job.pk}) is {status}" + (f": {message}" if message else "")
    return alert_emit(team_id=job.team_id, event=event, text=text, data={
        "job": job.pk, "name": job.name, "status": status, "message": message, "steps_done": job.steps_done,
    })


def alert_deadline_unreachable(*, job, message: str) -> list[AlertDelivery]:
    """Alert when a job's deadline can no longer be met, even on on-demand capacity."""
    text = f"Job {job.name} (#{job.pk}) will miss its deadline: {message}"
    return alert_emit(team_id=job.team_id, event=AlertEvent.JOB_DEADLINE_UNREACHABLE, text=text, data={
        "job": job.pk, "name": job.name, "deadline": job.deadline.isoformat() if job.deadline else None,
        "message": message, "steps_done": job.steps_done, "target_steps": job.target_steps,
    })


def alert_standby_released(*, job, instance_id: int, standby_s: float) -> list[AlertDelivery]:
    """Alert that a node stood by (paid, no generation taking it) past the limit and was released."""
    text = (f"Job {job.name} (#{job.pk}): node {instance_id} stood by {standby_s:.0f} s with no generation taking "
            "it; released")
    return alert_emit(team_id=job.team_id, event=AlertEvent.NODE_STANDBY_RELEASED, text=text, data={
        "job": job.pk, "name": job.name, "instance": instance_id, "standby_s": round(standby_s, 1)})


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
    # The session refuses to connect to a non-public peer (egress.py): DNS may have changed since
    # the check in alert_deliver.
    with egress.checked_session() as session:
        return session.post(url, data=data, headers=headers, timeout=TIMEOUT_S, allow_redirects=False).status_code


def _destination_refused(url: str) -> str:
    """Why `url`'s host may not be sent to now (it resolves to a non-public address), or ""."""
    parts = urlsplit(url)
    try:
        egress.check_host(parts.hostname or "", parts.port)
    except egress.EgressRefused as exc:
        return f"refused: {exc}"
    except (OSError, UnicodeError):
        return ""  # does not resolve now: the post fails as a network error and is retried
    return ""


def _without_path(text: str, url: str) -> str:
    """`text` without `url`'s path and query: for a Slack-style endpoint they are its secret, and
    requests names them in its errors ("Max retries exceeded with url: /services/...")."""
    parts = urlsplit(url)
    secret = parts.path + (f"?{parts.query}" if parts.query else "")
    for part in (secret, parts.path):
        if part not in ("", "/"):
            text = text.replace(part, "/<path>")
    return text


def _signature_headers(endpoint: AlertEndpoint, *, msg_id: str, body: bytes) -> dict[str, str]:
    current, *previous = endpoint.signing_secrets()
    return signing.signed_headers(secret=current, msg_id=msg_id, body=body, extra_secrets=previous)


def alert_deliver(*, delivery_id: int, post: Callable[..., int] = _post) -> str:
    """One delivery attempt. Returns "delivered", "retry" (5xx, 408, 429 or a network error, with
    `next_attempt_at` set by backoff), "failed" (other 4xx, MAX_ATTEMPTS reached, or the URL's host
    resolves to a non-public address: SSRF, egress.py) or "skipped"."""
    with transaction.atomic():
        delivery = AlertDelivery.objects.select_for_update().select_related("endpoint").filter(pk=delivery_id).first()
        if delivery is None or delivery.status != DeliveryStatus.PENDING:
            return "skipped"
        delivery.attempts += 1
        delivery.save(update_fields=["attempts"])
    body = alert_body(delivery)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               **_signature_headers(delivery.endpoint, msg_id=delivery.message_id, body=body)}
    status_code, error = None, ""
    refused = _destination_refused(delivery.endpoint.url)
    if not refused:
        try:
            status_code = post(delivery.endpoint.url, data=body, headers=headers)
        except requests.RequestException as exc:
            error = _without_path(f"{type(exc).__name__}: {exc}", delivery.endpoint.url)[:300]
    now = timezone.now()
    delivery.last_status_code, delivery.last_error = status_code, refused or error
    if refused:
        # Not a passing failure: the URL's host points inside; retrying would not change that.
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        outcome = "failed"
    elif status_code is not None and 200 <= status_code < 300:
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
        logger.warning("alert %s to endpoint %s (%s) failed after %d attempts: %s", delivery.message_id,
                       delivery.endpoint_id, urlsplit(delivery.endpoint.url).hostname,
                       delivery.attempts, delivery.last_error or delivery.last_status_code)
    return outcome
