"""An agent event sent again acts once: the agent's client retries a POST whose answer it lost (a
timeout, a 5xx), so the control plane keys each event on its instance and the id the agent gave it.
An event without an id (an older agent) still acts; a bad id is refused and writes nothing."""

from __future__ import annotations

import json
import threading

import pytest
import requests
import responses
from django.db import connection
from rest_framework.test import APIClient

from agent.client import ControlPlaneClient
from controlplane.jobs.models import JobEvent, JobStatus
from controlplane.orchestration import services
from controlplane.orchestration.providers import set_provider
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.enrolment import enrol_every_node
from tests.orchestration.fakes import FakeProvider

EVENTS = "/api/v1/agents/events/"
CRASH = {"kind": "worker_exit", "code": 1, "generation": 1, "log_tail": ["Traceback", "ValueError: boom"]}


def _running_job() -> tuple:
    """A DP=1 x PP=2 job that restarts one crash (max_restarts_on_errors=1), its two nodes enrolled
    and running generation 1; the first node's agent API client."""
    set_provider("local", FakeProvider())
    job = make_job(make_team(), strategy="recycle", max_restarts_on_errors=1,
                   plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    clients = enrol_every_node(job, acquisition)
    services.job_grow(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    return job, clients[0]


@pytest.fixture
def running(db):
    yield _running_job()
    set_provider("local", None)


def _crashes(job) -> int:
    return JobEvent.objects.filter(job=job, kind="agent_worker_exit").count()


def test_a_replayed_worker_exit_counts_once(running):
    job, client = running
    crash = {**CRASH, "id": "5f0c6d1e9a7b4c2d8e3f1a2b3c4d5e6f"}
    first = client.post(EVENTS, crash, format="json")
    replay = client.post(EVENTS, crash, format="json")  # the first answer was lost: the agent sent it again
    assert first.status_code == replay.status_code == 202
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING, job.status_message  # one crash, within max_restarts_on_errors=1
    assert _crashes(job) == 1

    # Another crash (its own id) is one too many: the job fails with two crashes counted, not three.
    assert client.post(EVENTS, {**CRASH, "id": "second-crash-0001"}, format="json").status_code == 202
    job.refresh_from_db()
    assert (job.status, job.end_reason) == (JobStatus.FAILED, "user_error")
    assert "crashed 2 time(s)" in job.status_message


def test_an_event_without_an_id_from_an_older_agent_still_acts(running):
    job, client = running
    for _ in range(2):
        assert client.post(EVENTS, CRASH, format="json").status_code == 202
    job.refresh_from_db()
    assert _crashes(job) == 2 and job.status == JobStatus.FAILED  # no id, nothing to tell a replay by


def test_only_the_events_that_act_keep_a_receipt(running):
    """A generation at 1,024 nodes brings 1,024 `generation_applied`: they only go on the timeline,
    so they skip the receipt (a replay of one is a second timeline row, nothing more)."""
    from controlplane.orchestration.models import AgentEventReceipt
    from controlplane.orchestration.services.agent_events import ACTING_KINDS

    job, client = running
    assert {"worker_exit", "requirements_failed", "profile_failed", "prepare_failed"} == ACTING_KINDS
    applied = {"kind": "generation_applied", "generation": 1, "id": "applied-event-0001"}
    for _ in range(2):
        assert client.post(EVENTS, applied, format="json").status_code == 202
    assert JobEvent.objects.filter(job=job, kind="agent_generation_applied").count() == 2
    assert not AgentEventReceipt.objects.exists()
    assert client.post(EVENTS, {**CRASH, "id": "crash-event-0001"}, format="json").status_code == 202
    assert AgentEventReceipt.objects.count() == 1


@pytest.mark.parametrize("bad", ["", "short", "x" * 65, "has space1", "dots.are.not.ok", "é-not-ascii-1", 12345678,
                                 None])
def test_a_bad_event_id_is_refused_and_writes_nothing(running, bad):
    job, client = running
    before = JobEvent.objects.filter(job=job).count()
    response = client.post(EVENTS, {**CRASH, "id": bad}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == ["id"], response.json()
    assert JobEvent.objects.filter(job=job).count() == before


@pytest.mark.django_db(transaction=True)
def test_two_deliveries_of_one_event_at_once_act_once():
    """On PostgreSQL both requests really race (the unique key, not a read, decides); SQLite's test
    database cannot host concurrent writers, so there they run one after the other."""
    job, client = _running_job()
    try:
        crash = {**CRASH, "id": "raced-event-0001"}
        answers: list[int] = []
        barrier = threading.Barrier(2)

        def deliver() -> None:
            own = APIClient()  # one test client per thread, as one agent's two connections
            own.credentials(**client._credentials)
            try:
                barrier.wait(timeout=10)
                answers.append(own.post(EVENTS, crash, format="json").status_code)
            finally:
                connection.close()

        if connection.vendor == "sqlite":
            answers += [client.post(EVENTS, crash, format="json").status_code for _ in range(2)]
        else:
            threads = [threading.Thread(target=deliver) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        assert answers == [202, 202]
        job.refresh_from_db()
        assert _crashes(job) == 1 and job.status == JobStatus.RUNNING
    finally:
        set_provider("local", None)


@responses.activate
def test_the_agents_client_keeps_an_events_id_across_its_retries():
    client = ControlPlaneClient("http://cp.test", token="sp_agent", stop=threading.Event(), backoff_s=0.001)
    bodies: list[dict] = []

    def answer(request):
        bodies.append(json.loads(request.body))
        if len(bodies) == 1:
            raise requests.ConnectionError("the answer was lost")  # the server may have acted already
        if len(bodies) == 2:
            return 503, {}, "{}"
        return 202, {}, ""

    responses.add_callback(responses.POST, "http://cp.test/api/v1/agents/events/", callback=answer)
    client.event(kind="worker_exit", code=1)
    assert len(bodies) == 3
    assert bodies[0]["id"] and bodies[0]["id"] == bodies[1]["id"] == bodies[2]["id"]
    client.event(kind="worker_exit", code=1)  # another event (even an equal one) gets its own id
    assert bodies[3]["id"] != bodies[0]["id"]
