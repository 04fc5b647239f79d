"""A job that cannot go on never stays `running`: the runtime's named reason (a worker exit the
agent reports) fails it, and the reconcile loop fails a job whose workers all went quiet. Either
way the reason is on the timeline, the status alert goes out and the nodes are released."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobStatus, MetricSample
from controlplane.orchestration import services
from controlplane.orchestration.providers import set_provider
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertDelivery
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.enrolment import enrol_every_node
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(settings):
    """A DP=1 x PP=2 job whose two nodes enrolled and run generation 1; the agents' API clients."""
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the alert URL is on loopback
    fake = FakeProvider()
    set_provider("local", fake)
    job = make_job(make_team(), strategy="recycle", target_steps=100, plan={"dp": 1, "pp": 2, "provider": "local"})
    alert_endpoint_create(team=job.team, url="http://127.0.0.1:9/hook")
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    clients = enrol_every_node(job, acquisition)
    services.job_grow(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    yield job, clients, fake
    set_provider("local", None)


def _alerts(job) -> list[str]:
    return list(AlertDelivery.objects.filter(endpoint__team=job.team).order_by("id").values_list("event", flat=True))


def test_a_runtime_failure_the_agent_reports_fails_and_releases_the_job(running, django_capture_on_commit_callbacks):
    job, clients, fake = running
    reason = "generation 3 cannot run: recycle has no surviving node for stage 0"
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        response = clients[1].post("/api/v1/agents/events/", {"kind": "worker_exit", "code": 4, "generation": 1,
                                                               "message": reason}, format="json")
    assert response.status_code == 202
    assert enqueued, "the release was not enqueued"
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.status_message == f"runtime cannot continue: {reason}"
    assert job.finished_at is not None
    failed = job.events.get(kind="job_failed")
    assert failed.data["reason"] == job.status_message and failed.data["from"] == "running"
    assert job.events.get(kind="agent_worker_exit").data["reason"] == reason
    assert _alerts(job) == ["job.failed"]

    # The reconcile the event enqueued releases every node.
    report = services.capacity_reconcile(job=job)
    assert len(report["released"]) == 2 and len(fake.terminated) == 2

    # Another member reporting the same failure changes nothing (one status change, one alert).
    clients[0].post("/api/v1/agents/events/", {"kind": "worker_exit", "code": 4, "message": reason}, format="json")
    assert job.events.filter(kind="job_failed").count() == 1 and _alerts(job) == ["job.failed"]


def test_an_ordinary_worker_exit_does_not_fail_the_job(running):
    job, clients, _ = running
    for code in (0, 1, -9, 3):
        response = clients[0].post("/api/v1/agents/events/", {"kind": "worker_exit", "code": code}, format="json")
        assert response.status_code == 202
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_reconcile_fails_a_job_whose_workers_stopped_reporting(running, monkeypatch):
    job, _, _ = running
    monkeypatch.setenv("SPOTPIPE_JOB_STALL_TIMEOUT_S", "60")
    now = timezone.now()
    job.generations.update(created_at=now - timedelta(seconds=40))
    MetricSample.objects.create(job=job, step=5, loss=1.0, at=now - timedelta(seconds=30))
    assert not services.job_fail_if_stalled(job=job, now=now)  # quiet for 30 s < 60 s
    assert not services.job_fail_if_stalled(job=job, now=now + timedelta(seconds=29))
    services.capacity_reconcile(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING

    assert services.job_fail_if_stalled(job=job, now=now + timedelta(seconds=31))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.status_message.startswith("no progress for 60 s")
    assert _alerts(job) == ["job.failed"]
    report = services.capacity_reconcile(job=job)
    assert len(report["released"]) == 2


def test_a_node_installing_the_jobs_requirements_is_not_a_stall(running, monkeypatch):
    job, clients, _ = running
    monkeypatch.setenv("SPOTPIPE_JOB_STALL_TIMEOUT_S", "60")
    now = timezone.now()
    job.generations.update(created_at=now - timedelta(seconds=600))  # no step since: pip is still at work
    clients[0].post("/api/v1/agents/events/", {"kind": "requirements_output", "message": "Building wheel for x"},
                    format="json")
    assert not services.job_fail_if_stalled(job=job, now=now + timedelta(seconds=30))
    assert services.job_fail_if_stalled(job=job, now=now + timedelta(seconds=90))  # and then quiet too long


def test_the_stall_net_fails_from_reconcile_and_ignores_jobs_that_never_ran(running, monkeypatch):
    job, _, _ = running
    monkeypatch.setenv("SPOTPIPE_JOB_STALL_TIMEOUT_S", "0.5")
    job.generations.update(created_at=timezone.now() - timedelta(seconds=5))  # no step since generation 1
    report = services.capacity_reconcile(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and len(report["released"]) == 2

    pending = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    assert not services.job_fail_if_stalled(job=pending)  # never ran: nothing to time out


def test_requirements_that_cannot_be_installed_fail_the_job_once(running, django_capture_on_commit_callbacks):
    # An agent's pip output lines are the job's events; its `requirements_failed` fails the job with
    # pip's lines as the reason, once however many nodes report it (issue 19, agent/requirements.py).
    job, clients, fake = running
    line = "Processing ./spotpipe_tinypkg-1.0-py3-none-any.whl"
    assert clients[0].post("/api/v1/agents/events/", {"kind": "requirements_output", "message": line},
                           format="json").status_code == 202
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.events.get(kind="agent_requirements_output").data["reason"] == line
    reason = "pip install exited with 1: ERROR: spotpipe-tinypkg has an invalid wheel"
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        for client in clients:
            response = client.post("/api/v1/agents/events/", {"kind": "requirements_failed", "generation": 1,
                                                               "message": reason}, format="json")
            assert response.status_code == 202
    assert enqueued, "the release was not enqueued"
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.status_message == f"requirements could not be installed: {reason}"
    assert job.events.filter(kind="job_failed").count() == 1 and _alerts(job) == ["job.failed"]
    assert len(services.capacity_reconcile(job=job)["released"]) == 2 and len(fake.terminated) == 2
