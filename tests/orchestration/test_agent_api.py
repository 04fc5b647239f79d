"""The agent protocol endpoints: enrol, commands (long-poll), notices, events."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from agent.command import AgentCommand
from controlplane.accounts.services import api_token_create
from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.orchestration import services
from controlplane.orchestration.providers import set_provider
from tests.controlplane.factories import make_job, make_team, make_user
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def started():
    set_provider("local", FakeProvider())
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    yield job, acquisition
    set_provider("local", None)


def _enroll(client: APIClient, acquisition, provider_id: str):
    key = services.acquisition_enroll_key(acquisition=acquisition)
    return client.post("/api/v1/agents/enroll/", {"enroll_key": key, "provider_instance_id": provider_id},
                       format="json")


def _agent(acquisition, provider_id: str) -> tuple[APIClient, int]:
    client = APIClient()
    answer = _enroll(client, acquisition, provider_id).json()
    client.credentials(HTTP_AUTHORIZATION=f"Token {answer['token']}")
    return client, answer["instance"]


def test_enroll_answers(started):
    job, acquisition = started
    client = APIClient()
    bad = client.post("/api/v1/agents/enroll/", {"enroll_key": "1.nope", "provider_instance_id": "fake-1"},
                      format="json")
    assert bad.status_code == 403 and "enroll_key" in bad.json()["errors"]
    # Made-up keys a 500 once answered: a non-ASCII mac, a digit int() refuses, an id past bigint.
    for made_up in (f"{acquisition.pk}.é", "².abc", "99999999999999999999999.abc"):
        refused = client.post("/api/v1/agents/enroll/", {"enroll_key": made_up, "provider_instance_id": "fake-1"},
                              format="json")
        assert refused.status_code == 403 and "enroll_key" in refused.json()["errors"], made_up
    missing = client.post("/api/v1/agents/enroll/", {"enroll_key": "x"}, format="json")
    assert missing.status_code == 400 and "provider_instance_id" in missing.json()["errors"]
    assert _enroll(client, acquisition, "fake-99").status_code == 409  # not attached (yet)
    ok = _enroll(client, acquisition, "fake-1")
    assert ok.status_code == 201
    assert ok.json()["job"] == job.pk and ok.json()["token"].startswith("sp_")
    assert Instance.objects.get(pk=ok.json()["instance"]).state == "running"


def test_commands_long_poll(started):
    job, acquisition = started
    client, instance_id = _agent(acquisition, "fake-1")
    first = client.get("/api/v1/agents/commands/").json()
    assert first["action"] == "idle" and first["generation"] is None and first["job"]["id"] == job.pk

    started_at = time.monotonic()
    held = client.get("/api/v1/agents/commands/", {"version": first["version"], "wait": 0.3}).json()
    assert time.monotonic() - started_at >= 0.3
    assert held["version"] == first["version"]

    _agent(acquisition, "fake-2")
    services.job_grow(job=job)
    answer = client.get("/api/v1/agents/commands/", {"version": first["version"], "wait": 5}).json()
    assert answer["action"] == "run"
    assert answer["generation"]["number"] == 1
    assert answer["assignment"] == {"instance": instance_id, "rank": 0, "pipeline": 0, "stage": 0, "node": 0}
    # What the agent reads of these answers, typed: every field it needs is on the wire.
    idle, run = AgentCommand.from_dict(first), AgentCommand.from_dict(answer)
    assert (idle.action, idle.generation, idle.job.id, idle.instance) == ("idle", None, job.pk, instance_id)
    assert (run.action, run.generation_number, run.assignment["node"], run.job.strategy) == ("run", 1, 0, "recycle")
    assert run.generation.to_dict() == answer["generation"] and run.job.to_dict() == answer["job"]

    bad = client.get("/api/v1/agents/commands/", {"wait": 500})
    assert bad.status_code == 400 and "wait" in bad.json()["errors"]


def test_commands_refuse_users(started):
    job, _ = started
    user = make_user(job.team)
    _, key = api_token_create(team=job.team, user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/agents/commands/").status_code == 403
    assert APIClient().get("/api/v1/agents/commands/").status_code in (401, 403)


def test_notice_is_stored_once(started):
    _job, acquisition = started
    client, _ = _agent(acquisition, "fake-1")
    body = {"kind": "interruption", "action": "terminate", "deadline": "2030-01-01T00:02:00Z", "cloud": "aws",
            "raw": {"action": "terminate", "time": "2030-01-01T00:02:00Z"}}
    first = client.post("/api/v1/agents/notices/", body, format="json")
    second = client.post("/api/v1/agents/notices/", body, format="json")
    assert first.status_code == second.status_code == 202
    assert first.json()["duplicate"] is False and second.json()["duplicate"] is True
    notice = InterruptionNotice.objects.get(pk=first.json()["notice"])
    assert (notice.source, notice.kind, notice.provider_instance_id) == ("agent", "interruption", "fake-1")
    bad = client.post("/api/v1/agents/notices/", {"kind": "explode"}, format="json")
    assert bad.status_code == 400 and "kind" in bad.json()["errors"]


def test_worker_events_go_on_the_timeline(started):
    job, acquisition = started
    client, _ = _agent(acquisition, "fake-1")
    response = client.post("/api/v1/agents/events/", {"kind": "generation_applied", "generation": 1, "step": 4},
                           format="json")
    assert response.status_code == 202
    event = job.events.get(kind="agent_generation_applied")
    assert event.data["step"] == 4


def test_a_spare_worker_goes_on_the_timeline(started):
    job, acquisition = started
    client, instance_id = _agent(acquisition, "fake-1")
    response = client.post("/api/v1/agents/events/", {"kind": "worker_spare", "generation": 2,
                                                      "message": "runtime generation 5 has no slot for this node"},
                           format="json")
    assert response.status_code == 202
    event = job.events.get(kind="agent_worker_spare")
    assert (event.data["instance"], event.data["generation"]) == (instance_id, 2)
    assert "no slot" in event.message and "no slot" in event.data["reason"]
    unknown = client.post("/api/v1/agents/events/", {"kind": "worker_idle"}, format="json")
    assert unknown.status_code == 400 and "kind" in unknown.json()["errors"]


def test_a_row_deleted_after_authorisation_is_not_found_not_a_server_error(started, monkeypatch):
    # Seen when an instance's rows went away while its agent was polling: the service's lookup raised
    # DoesNotExist after the token had been accepted, and the API answered 500.
    _job, acquisition = started
    client, _instance_id = _agent(acquisition, "fake-1")

    def gone(**_kwargs):
        raise Instance.DoesNotExist("Instance matching query does not exist.")

    monkeypatch.setattr(services, "agent_commands", gone)
    answer = client.get("/api/v1/agents/commands/")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "Instance matching query does not exist.", "errors": {}}
