"""With a real Celery worker (the project's app, the configured broker: kombu's filesystem
transport by default, Redis when REDIS_URL is set): a notice reaches its reaction through the
batched hand-off, and a backlog stored while the worker and broker were unavailable is processed
exactly once by the sweep when the worker returns."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun
from django.db import connections

from controlplane.celery import app
from controlplane.fleet import notices
from controlplane.fleet.models import InterruptionNotice, NoticeStatus
from controlplane.fleet.notices import handoff
from controlplane.fleet.services import instance_transition
from controlplane.jobs.models import JobEvent, Reconfiguration
from controlplane.orchestration.tasks import sweep_notices
from controlplane.webhooks import signing
from controlplane.webhooks.credentials import credentials_cache_clear
from tests.controlplane.factories import make_instance, make_job, make_team, make_webhook_credential

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
WAIT_S = 60  # an upper bound for a loaded machine, not a timing assertion


class TaskWatch:
    """Signals when a named task has finished in the worker, so the test thread waits without
    polling the database while the worker writes to it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = threading.Event()
        self.count = 0

    def __call__(self, sender=None, **kwargs):
        # Runs in the worker thread: drop its connection so the test database can be torn down.
        connections.close_all()
        if sender is not None and sender.name == self.name:
            self.count += 1
            self.done.set()


@pytest.fixture
def watch():
    watches = []

    def make(name: str) -> TaskWatch:
        w = TaskWatch(name)
        task_postrun.connect(w, weak=False)
        watches.append(w)
        return w

    yield make
    for w in watches:
        task_postrun.disconnect(w)


@pytest.fixture(scope="module", autouse=True)
def own_queue():
    """Route tasks to a queue only this module's workers consume: the broker (Redis, or the
    filesystem folder) may be shared with other test runs and a running control plane, whose
    workers would otherwise take our tasks. Celery caches its router, hence the resets."""
    queue = f"notices-test-{uuid.uuid4().hex[:8]}"
    previous = app.conf.task_default_queue, app.conf.task_routes

    def reset_routing() -> None:
        app.amqp.flush_routes()
        for cached in ("queues", "router", "default_queue"):
            app.amqp.__dict__.pop(cached, None)

    app.conf.task_default_queue = queue
    app.conf.task_routes = {"*": {"queue": queue}}
    reset_routing()
    try:
        yield queue
    finally:
        app.conf.task_default_queue, app.conf.task_routes = previous
        reset_routing()


@pytest.fixture
def setup_team(settings):
    settings.SPOTPIPE_NOTICE_HANDOFF = "batched"
    settings.SPOTPIPE_NOTICE_KICK_WINDOW_S = 0.05
    notices.drain_started()  # no flag left over from an earlier run on the same Redis
    credentials_cache_clear()
    team = make_team("worker-team")
    _, secret = make_webhook_credential(team, "generic", "standard_webhooks")
    instances = []
    for n in range(4):
        instance = make_instance(team, job=make_job(team), provider_instance_id=f"i-worker{n}")
        for state in ("pending", "running"):
            instance_transition(instance=instance, to=state)
        instances.append(instance)
    yield team, secret, instances
    credentials_cache_clear()


def post_notice(client, secret: str, instance_id: str, msg_id: str):
    body = json.dumps({"instance_id": instance_id, "action": "terminate"}).encode()
    headers = signing.signed_headers(secret=secret, msg_id=msg_id, body=body)
    return client.post("/api/v1/webhooks/notice/worker-team/", data=body, content_type="application/json",
                       headers=headers)


def worker():
    return start_worker(app, pool="solo", concurrency=1, perform_ping_check=False, shutdown_timeout=30,
                        queues=[app.conf.task_default_queue])


def test_notice_reaches_its_reaction_through_the_batched_handoff(client, setup_team, watch):
    _, secret, instances = setup_team
    drained = watch("fleet.drain_notices")
    with worker():
        response = post_notice(client, secret, instances[0].provider_instance_id, "live-1")
        assert response.status_code == 202
        assert drained.done.wait(WAIT_S), "the kick did not reach the worker"
    notice = InterruptionNotice.objects.get()
    assert notice.status == NoticeStatus.PROCESSED
    instances[0].refresh_from_db()
    assert instances[0].state == "notice"
    assert Reconfiguration.objects.filter(instance=instances[0]).count() == 1


def test_backlog_stored_while_down_is_processed_once_by_the_sweep(client, setup_team, watch, monkeypatch):
    _, secret, instances = setup_team

    def broker_down():
        raise ConnectionError("broker unreachable")

    # Worker stopped and broker unreachable: the endpoint still stores and answers.
    monkeypatch.setattr(handoff, "_publish_drain", broker_down)
    statuses = Counter()
    for n in range(12):
        instance = instances[n % len(instances)]
        statuses[post_notice(client, secret, instance.provider_instance_id, f"down-{n}").status_code] += 1
        if n % 4 == 0:  # retries of the same delivery
            statuses[post_notice(client, secret, instance.provider_instance_id, f"down-{n}").status_code] += 1
    assert statuses == {202: 12, 200: 3}
    assert InterruptionNotice.objects.filter(status=NoticeStatus.RECEIVED).count() == 12
    assert not JobEvent.objects.exclude(kind="submitted").exists()

    monkeypatch.undo()
    swept = watch("fleet.sweep_notices")
    with worker():
        sweep_notices.delay()  # what beat sends every few seconds
        assert swept.done.wait(WAIT_S), "the sweep did not run"
    assert InterruptionNotice.objects.filter(status=NoticeStatus.PROCESSED).count() == 12
    assert set(InterruptionNotice.objects.values_list("attempts", flat=True)) == {1}
    per_notice = Counter(JobEvent.objects.exclude(kind="submitted").values_list("data__notice", flat=True))
    assert len(per_notice) == 12 and set(per_notice.values()) == {1}
    assert Reconfiguration.objects.count() == len(instances)  # one per leaving node
    for instance in instances:
        instance.refresh_from_db()
        assert instance.state == "notice"
        assert instance.events.filter(to_state="notice").count() == 1

    # A second sweep (the next beat tick) finds nothing left to do.
    swept.done.clear()
    with worker():
        sweep_notices.delay()
        assert swept.done.wait(WAIT_S)
    assert JobEvent.objects.exclude(kind="submitted").count() == 12
