"""Outbound alerts survive a broker outage (issue 21): the AlertDelivery rows are the outbox. An alert
emitted while the broker is down neither fails the caller nor gets lost: the beat task
`webhooks.sweep_alerts` enqueues every pending delivery whose task was lost, once it is overdue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from controlplane.beat import BEAT_SCHEDULE
from controlplane.webhooks import alerts, tasks
from controlplane.webhooks.models import AlertDelivery, DeliveryStatus
from tests.controlplane.factories import make_team
from tests.controlplane.test_webhooks_alerts import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings):
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the receiver listens on loopback
    server = Receiver()
    yield server
    server.close()


def _broker_down(*args, **kwargs):
    raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def test_an_alert_emitted_while_the_broker_is_down_is_swept_and_delivered(
    receiver, monkeypatch, django_capture_on_commit_callbacks
):
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=receiver.url)
    monkeypatch.setattr(tasks.deliver_alert, "delay", _broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        deliveries = alerts.alert_emit(team_id=team.pk, event="job.failed", text="job failed", data={"job": 1})
    # The caller's work stood; the delivery waits in the outbox.
    delivery = AlertDelivery.objects.get(pk=deliveries[0].pk)
    assert delivery.status == DeliveryStatus.PENDING and delivery.attempts == 0

    now = timezone.now()
    assert alerts.alerts_sweep(now=now) == []  # not overdue yet: its task may still be queued
    later = now + alerts.SWEEP_GRACE + timedelta(seconds=1)
    assert alerts.alerts_sweep(now=later) == [delivery.pk]
    assert alerts.alerts_sweep(now=later) == []  # claimed for the lease: not sent twice

    # The broker is back: the periodic sweep enqueues it, the worker delivers it.
    AlertDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=now - timedelta(minutes=2))
    enqueued: list[int] = []
    monkeypatch.setattr(tasks.deliver_alert, "delay", enqueued.append)
    assert tasks.sweep_alerts.apply().get() == 1
    assert enqueued == [delivery.pk]
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "delivered"
    assert len(receiver.received) == 1
    assert receiver.received[0][0]["webhook-id"] == delivery.message_id


def test_a_retry_lost_with_the_broker_is_swept_when_due(receiver, monkeypatch):
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=receiver.url)
    receiver.statuses = [503]
    monkeypatch.setattr(tasks.deliver_alert, "delay", lambda *a: None)
    delivery = alerts.alert_emit(team_id=team.pk, event="job.failed", text="t", data={})[0]
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "retry"
    delivery.refresh_from_db()
    due = delivery.next_attempt_at
    # Before its backoff is over (plus the grace) the sweep leaves it to its own retry.
    assert alerts.alerts_sweep(now=due) == []
    assert alerts.alerts_sweep(now=due + alerts.SWEEP_GRACE + timedelta(seconds=1)) == [delivery.pk]


def test_finished_deliveries_are_never_swept(receiver, monkeypatch):
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=receiver.url)
    monkeypatch.setattr(tasks.deliver_alert, "delay", lambda *a: None)
    delivery = alerts.alert_emit(team_id=team.pk, event="job.failed", text="t", data={})[0]
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "delivered"
    assert alerts.alerts_sweep(now=timezone.now() + timedelta(days=1)) == []


def test_the_sweep_is_scheduled():
    assert BEAT_SCHEDULE["webhooks.sweep_alerts"]["task"] == "webhooks.sweep_alerts"
    assert BEAT_SCHEDULE["webhooks.sweep_alerts"]["schedule"] <= alerts.SWEEP_GRACE.total_seconds()
