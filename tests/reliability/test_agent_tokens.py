"""Agent tokens (issue 21): one live token per instance, revoked when the instance ends (released,
terminated, preempted, failed; one by one or in a notice batch), expiring after
SPOTPIPE_AGENT_TOKEN_TTL_S, and rotatable by the agent. A revoked or expired token gets 401."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import responses
from django.utils import timezone
from rest_framework.test import APIClient

from agent.client import ControlPlaneClient, ControlPlaneError
from agent.main import Agent, AgentConfig
from controlplane.accounts.models import ApiToken, TokenKind
from controlplane.accounts.services import api_token_create
from controlplane.common.errors import Conflict
from controlplane.fleet.models import NoticeKind, NoticeSource
from controlplane.fleet.notices import NoticeDraft, notices_store
from controlplane.fleet.services import instance_transition
from controlplane.orchestration import services
from controlplane.orchestration.notices import notices_process_batch
from controlplane.orchestration.providers import set_provider
from tests.controlplane.factories import make_instance, make_job, make_team
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db

COMMANDS = "/api/v1/agents/commands/"


@pytest.fixture(autouse=True)
def _no_rendezvous_store(monkeypatch):
    """The jobs here start on a fake provider: no per-job TCPStore process (each run of this module
    left two behind before), as in tests/orchestration/conftest.py."""
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "none")


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def _running(team, **fields):
    instance = make_instance(team, **fields)
    for state in ("pending", "running"):
        instance_transition(instance=instance, to=state)
    return instance


def _agent_key(instance) -> str:
    return api_token_create(team=instance.team, kind=TokenKind.AGENT, instance=instance)[1]


@pytest.fixture
def started():
    set_provider("local", FakeProvider())
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    yield job, acquisition
    set_provider("local", None)


def _enroll(acquisition, provider_id: str) -> dict:
    key = services.acquisition_enroll_key(acquisition=acquisition)
    answer = APIClient().post("/api/v1/agents/enroll/", {"enroll_key": key, "provider_instance_id": provider_id},
                              format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


# --- revoked when the instance ends -------------------------------------------------------------


@pytest.mark.parametrize("end", ["terminated", "preempted", "failed"])
def test_an_ended_instance_token_gets_401(end):
    instance = _running(make_team())
    client = _client(_agent_key(instance))
    assert client.get(COMMANDS).status_code == 200
    instance_transition(instance=instance, to=end)
    refused = client.get(COMMANDS)
    assert refused.status_code == 401, refused.content
    assert ApiToken.objects.get(instance=instance).revoked_at is not None


def test_released_nodes_lose_their_tokens(started):
    job, acquisition = started
    answers = [_enroll(acquisition, f"fake-{n}") for n in (1, 2)]
    clients = [_client(a["token"]) for a in answers]
    assert all(c.get(COMMANDS).status_code == 200 for c in clients)
    job.status = "cancelled"
    job.save(update_fields=["status"])
    assert sorted(services.capacity_release(job=job)) == sorted(a["instance"] for a in answers)
    assert [c.get(COMMANDS).status_code for c in clients] == [401, 401]


def test_a_preemption_processed_in_a_notice_batch_revokes_the_token(settings):
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"
    team = make_team()
    instances = [_running(team, job=make_job(team)) for _ in range(2)]
    clients = [_client(_agent_key(i)) for i in instances]
    drafts = [NoticeDraft(team_id=team.pk, source=NoticeSource.GENERIC, kind=NoticeKind.PREEMPTED,
                          action="terminate", dedup_key=f"{team.pk}:test:{i.pk}",
                          provider_instance_id=i.provider_instance_id) for i in instances]
    stored = notices_store(drafts=drafts)
    assert notices_process_batch(notice_ids=list(stored.stored.values())) == (2, 0)
    for instance, client in zip(instances, clients, strict=True):
        instance.refresh_from_db()
        assert instance.state == "preempted"
        assert client.get(COMMANDS).status_code == 401


def test_an_ended_instance_gets_no_new_token():
    instance = _running(make_team())
    instance_transition(instance=instance, to="terminated")
    with pytest.raises(Conflict):
        _agent_key(instance)


# --- one live token per instance --------------------------------------------------------------


def test_a_new_enrolment_revokes_the_previous_token(started):
    _job, acquisition = started
    first = _enroll(acquisition, "fake-1")
    second = _enroll(acquisition, "fake-1")
    assert first["instance"] == second["instance"]
    assert _client(first["token"]).get(COMMANDS).status_code == 401
    assert _client(second["token"]).get(COMMANDS).status_code == 200
    live = ApiToken.objects.filter(instance_id=first["instance"], revoked_at__isnull=True)
    assert live.count() == 1


def test_an_admin_created_agent_token_replaces_the_live_one():
    instance = _running(make_team())
    old, new = _agent_key(instance), _agent_key(instance)
    assert _client(old).get(COMMANDS).status_code == 401
    assert _client(new).get(COMMANDS).status_code == 200


def test_the_database_refuses_a_second_live_agent_token():
    from django.db import IntegrityError, transaction

    instance = _running(make_team())
    _agent_key(instance)
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiToken.objects.create(team=instance.team, kind=TokenKind.AGENT, instance=instance, prefix="sp_dup",
                                key_hash="0" * 64)


# --- expiry ------------------------------------------------------------------------------------------


def test_agent_tokens_expire_after_the_setting(settings):
    settings.SPOTPIPE_AGENT_TOKEN_TTL_S = 120
    instance = _running(make_team())
    before = timezone.now()
    key = _agent_key(instance)
    token = ApiToken.objects.get(instance=instance)
    assert before + timedelta(seconds=119) <= token.expires_at <= timezone.now() + timedelta(seconds=120)
    # An explicit later expiry is capped at the setting too.
    far = api_token_create(team=instance.team, kind=TokenKind.AGENT, instance=instance,
                           expires_at=timezone.now() + timedelta(days=365))[0]
    assert far.expires_at <= timezone.now() + timedelta(seconds=120)
    assert _client(key).get(COMMANDS).status_code == 401  # replaced by `far`


def test_an_expired_agent_token_gets_401():
    instance = _running(make_team())
    client = _client(_agent_key(instance))
    ApiToken.objects.filter(instance=instance).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get(COMMANDS).status_code == 401


def test_enrolment_answers_the_expiry(started, settings):
    settings.SPOTPIPE_AGENT_TOKEN_TTL_S = 600
    _job, acquisition = started
    answer = _enroll(acquisition, "fake-1")
    expires = datetime.fromisoformat(answer["expires_at"].replace("Z", "+00:00"))
    assert timedelta(seconds=590) < expires - datetime.now(UTC) <= timedelta(seconds=600)


# --- rotation ----------------------------------------------------------------------------------------


def test_rotation_gives_a_new_token_and_revokes_the_old_one(settings):
    settings.SPOTPIPE_AGENT_TOKEN_TTL_S = 600
    instance = _running(make_team())
    old = _client(_agent_key(instance))
    rotated = old.post("/api/v1/agents/token/")
    assert rotated.status_code == 201, rotated.content
    body = rotated.json()
    assert body["instance"] == instance.pk and body["token"].startswith("sp_") and body["expires_at"]
    assert old.get(COMMANDS).status_code == 401
    assert _client(body["token"]).get(COMMANDS).status_code == 200
    assert ApiToken.objects.filter(instance=instance, revoked_at__isnull=True).count() == 1


def test_users_cannot_rotate_agent_tokens():
    from tests.controlplane.api_helpers import make_api_token, make_api_user

    team = make_team()
    user_key = make_api_token(team, user=make_api_user(team))
    assert _client(user_key).post("/api/v1/agents/token/").status_code == 403
    assert APIClient().post("/api/v1/agents/token/").status_code == 401


# --- the agent's side ------------------------------------------------------------------------------


@responses.activate
def test_a_call_refused_with_the_old_token_retries_with_the_rotated_one():
    """A call sent with the old token while a rotation replaced it is refused (401); the client
    retries with the new token instead of taking the 401 as 'this node is done'."""
    client = ControlPlaneClient("http://cp.test", token="sp_old", stop=threading.Event())

    def commands(request):
        if request.headers["Authorization"] == "Token sp_old":
            client.token = "sp_new"  # the rotation's answer arrived meanwhile
            return 401, {}, '{"detail": "invalid, revoked or expired token"}'
        return 200, {}, '{"version": "v1"}'

    responses.add_callback(responses.GET, "http://cp.test/api/v1/agents/commands/", callback=commands)
    assert client.commands(version="", wait_s=0) == {"version": "v1"}
    # A genuine 401 (no rotation) still reaches the caller.
    client.token = "sp_old"
    responses.replace(responses.GET, "http://cp.test/api/v1/agents/commands/", status=401, json={})
    with pytest.raises(ControlPlaneError) as refused:
        client.commands(version="", wait_s=0)
    assert refused.value.status == 401


@responses.activate
def test_the_agent_rotates_its_token_at_half_life(tmp_path):
    soon = (datetime.now(UTC) + timedelta(seconds=0.2)).isoformat()
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    responses.add(responses.POST, "http://cp.test/api/v1/agents/token/",
                  json={"instance": 7, "token": "sp_new", "expires_at": later}, status=201)
    agent = Agent(AgentConfig(control_plane="http://cp.test", token="sp_old", instance=7, work_dir=tmp_path,
                              address="127.0.0.1"), watcher=None)
    agent._schedule_rotation(soon)
    agent._rotate_token_if_due()
    assert agent.client.token == "sp_old"  # not yet: half of 0.2 s
    agent._rotate_at = 0.0
    agent._rotate_token_if_due()
    assert agent.client.token == "sp_new"
    assert responses.calls[0].request.headers["Authorization"] == "Token sp_old"
    # The next rotation is due at half the new token's life, about 30 minutes from now.
    import time

    assert 1700 < agent._rotate_at - time.monotonic() <= 1800
