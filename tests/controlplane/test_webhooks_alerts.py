"""Outbound alerts against a local HTTP server: signed with Standard Webhooks, Slack or generic
JSON, retried with backoff on 5xx, given up on 4xx."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.webhooks import alerts, signing
from controlplane.webhooks.models import AlertDelivery, DeliveryStatus
from controlplane.webhooks.tasks import deliver_alert
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db


class Receiver:
    """Answers POSTs with the queued status codes (then 200) and keeps what it received."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.received: list[tuple[dict, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    # The receivers listen on loopback, which alerts refuse unless an operator allows it (SSRF).
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    made = []

    def make(statuses=None) -> Receiver:
        r = Receiver(statuses)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_generic_alert_is_signed_and_delivered(receiver):
    server = receiver()
    team = make_team()
    endpoint = alerts.alert_endpoint_create(team=team, url=server.url)
    job = make_job(team, name="llama-small")
    [delivery] = alerts.alert_job_status(job=job, status="recovering", message="node i-1 preempted")
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "delivered"
    headers, body = server.received[0]
    signing.verify(secrets_=[endpoint.signing_secret], msg_id=headers["webhook-id"],
                   timestamp=headers["webhook-timestamp"], signature=headers["webhook-signature"], body=body)
    data = json.loads(body)
    assert data["type"] == "job.recovering"
    assert data["data"]["job"] == job.pk and data["data"]["status"] == "recovering"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (DeliveryStatus.DELIVERED, 1, 200)


def test_slack_format_and_event_filter(receiver):
    server = receiver()
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=server.url, format="slack", events=["budget.threshold"])
    job = make_job(team)
    assert alerts.alert_job_status(job=job, status="finished") == []  # not subscribed
    assert alerts.alert_job_status(job=job, status="running") == []  # not an alert status
    [delivery] = alerts.alert_budget_threshold(team_id=team.pk, job=job, threshold_pct=80, spent_usd="8.00",
                                               budget_usd="10.00")
    alerts.alert_deliver(delivery_id=delivery.pk)
    assert json.loads(server.received[0][1]) == {
        "text": f"Spending of job {job.name} (#{job.pk}) crossed 80% of its budget: $8.00 of $10.00"
    }


def test_server_errors_are_retried_with_backoff_then_delivered(receiver):
    server = receiver([503, 500])
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=server.url)
    [delivery] = alerts.alert_job_status(job=make_job(team), status="failed", message="out of budget")
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "retry"
    delivery.refresh_from_db()
    first_wait = (delivery.next_attempt_at - delivery.created_at).total_seconds()
    assert (delivery.status, delivery.last_status_code) == (DeliveryStatus.PENDING, 503)
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "retry"
    delivery.refresh_from_db()
    assert (delivery.next_attempt_at - delivery.created_at).total_seconds() > first_wait
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "delivered"
    assert [alerts.backoff_s(n) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]
    ids = {h["webhook-id"] for h, _ in server.received}
    assert len(server.received) == 3 and len(ids) == 1  # the same message id on every retry


def test_client_error_is_not_retried(receiver):
    server = receiver([410])
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=server.url)
    [delivery] = alerts.alert_job_status(job=make_job(team), status="finished")
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "failed"
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "skipped"
    assert len(server.received) == 1


def test_task_retries_until_delivered(receiver):
    """The Celery task re-runs a transient failure (eagerly here; with countdowns in a worker)."""
    server = receiver([502, 502])
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=server.url)
    [delivery] = alerts.alert_job_status(job=make_job(team), status="recovered")
    deliver_alert.apply(args=[delivery.pk])
    delivery = AlertDelivery.objects.get(pk=delivery.pk)
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.DELIVERED, 3)
    assert len(server.received) == 3


def test_gives_up_after_max_attempts(receiver, monkeypatch):
    monkeypatch.setattr(alerts, "MAX_ATTEMPTS", 2)
    server = receiver([500, 500, 500])
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=server.url)
    [delivery] = alerts.alert_job_status(job=make_job(team), status="failed")
    assert [alerts.alert_deliver(delivery_id=delivery.pk) for _ in range(3)] == ["retry", "failed", "skipped"]


def test_a_failed_alert_never_logs_or_stores_the_urls_secret_path(receiver, monkeypatch, caplog):
    """A Slack-style endpoint's path is its secret: a refusal and a network error name the endpoint
    and its host, never the path (requests puts it in its errors)."""
    monkeypatch.setattr(alerts, "MAX_ATTEMPTS", 1)
    secret = "T0001/B0002/SlackSecretPathXYZ123"
    refusing = receiver([404])
    gone = receiver()
    gone_url = gone.url
    gone.close()  # nothing listens there any more: a connection error naming the URL
    team = make_team()
    for server_url in (refusing.url, gone_url):
        alerts.alert_endpoint_create(team=team, url=f"{server_url}/services/{secret}?token=q-secret")
    deliveries = alerts.alert_job_status(job=make_job(team), status="failed")
    assert sorted(alerts.alert_deliver(delivery_id=d.pk) for d in deliveries) == ["failed", "failed"]
    errors = [d.last_error for d in AlertDelivery.objects.all()]
    assert any("ConnectionError" in e and "/<path>" in e for e in errors), errors
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "failed after 1 attempts" in logged and "127.0.0.1" in logged
    for text in (logged, *errors):
        assert "SlackSecretPathXYZ123" not in text and "q-secret" not in text
