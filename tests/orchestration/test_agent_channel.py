"""The agent command channel of the ASGI entry point (controlplane/asgi.py), driven in process: a
held long-poll is released promptly when the agent's command changes (by the Redis wake-up, and
by the database poll alone without Redis), and held polls take no thread, so a webhook still
answers while 100 of them are held by a worker with two threads."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from asgiref.sync import sync_to_async
from django.test import Client, override_settings

from controlplane.asgi import ControlPlane
from controlplane.common import agent_wake
from controlplane.orchestration import services
from controlplane.orchestration.providers import set_provider
from controlplane.wsgi import application as wsgi_application
from tests.controlplane.factories import make_job, make_team, make_webhook_credential
from tests.orchestration.asgi_client import asgi_control_plane, asgi_request, http_scope
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db(transaction=True)

# The run's Redis (per xdist worker, tests/xdist_isolation.py). Unset on the embedded default, where
# the wake-up has no Redis to ride and only the database-poll tests below apply; set and unreachable
# is a failure, not a skip.
REDIS_URL = os.environ.get("REDIS_URL", "")
PATH = "/api/v1/agents/commands/"


async def _call(app, *, method: str, path: str, query: str = "", headers: dict[str, str] | None = None,
                body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP request through the ASGI app; the client stays connected until it has the answer."""
    status, _headers, content = await asgi_request(app, http_scope(method=method, path=path, headers=headers,
                                                                   query=query), body)
    return status, content


@pytest.fixture
def agent():
    """A started job (dp=1 x pp=2, recycle) with both nodes enrolled; the first node's token."""
    set_provider("local", FakeProvider())
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    key = services.acquisition_enroll_key(acquisition=acquisition)
    tokens = [services.agent_enroll(enroll_key=key, provider_instance_id=f"fake-{n}")[1] for n in (1, 2)]
    yield job, {"Authorization": f"Token {tokens[0]}"}
    set_provider("local", None)


def _app(**kwargs) -> ControlPlane:
    return asgi_control_plane(wsgi_application, **kwargs)


async def _release_time(app: ControlPlane, job, headers) -> tuple[float, dict]:
    """Hold a poll on the current version, publish the first generation, and time the release."""
    status, body = await _call(app, method="GET", path=PATH, headers=headers)
    assert status == 200, body
    first = json.loads(body)
    assert first["action"] == "idle"
    poll = asyncio.create_task(_call(app, method="GET", path=PATH, query=f"version={first['version']}&wait=10",
                                     headers=headers))
    while app.waiters.held == 0:
        await asyncio.sleep(0.01)
    started = time.monotonic()
    await sync_to_async(services.job_grow, thread_sensitive=False)(job=job)
    status, body = await poll
    assert status == 200, body
    return time.monotonic() - started, json.loads(body)


@pytest.mark.skipif(not REDIS_URL, reason="the Redis wake-up needs REDIS_URL (set in CI's PostgreSQL + Redis pass)")
def test_a_held_poll_is_released_by_the_redis_wake_up(agent):
    job, headers = agent
    # The database poll every 30 s: only the Redis message can release the poll in time.
    app = _app(redis_url=REDIS_URL, fast_poll_s=30, slow_poll_s=30)
    agent_wake._client = None

    async def scenario():
        starter = asyncio.create_task(app.waiters.wait(instance_id=-1, job_id=None, version="", timeout_s=0.5))
        while not app.waiters.subscribed:  # the subscriber is up before anything is published
            await asyncio.sleep(0.01)
        await starter
        released_in, answer = await _release_time(app, job, headers)
        await app.waiters.close()
        return released_in, answer

    with override_settings(REDIS_URL=REDIS_URL):
        released_in, answer = asyncio.run(scenario())
    agent_wake._client = None
    assert answer["action"] == "run" and answer["generation"]["number"] == 1
    assert released_in < 2.0, released_in  # the other path would take 30 s (Redis) or 10 s (poll)


def test_a_held_poll_is_released_by_the_database_poll_without_redis(agent):
    job, headers = agent
    app = _app(redis_url="", fast_poll_s=0.05)

    async def scenario():
        result = await _release_time(app, job, headers)
        await app.waiters.close()
        return result

    with override_settings(REDIS_URL=""):
        released_in, answer = asyncio.run(scenario())
    assert answer["action"] == "run" and answer["generation"]["number"] == 1
    assert released_in < 2.0, released_in  # the other path would take 30 s (Redis) or 10 s (poll)


def test_a_hundred_held_polls_do_not_block_a_webhook(agent):
    job, headers = agent
    team = job.team
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    event = {"version": "0", "id": "channel-ev-1", "source": "aws.ec2", "account": "123456789012",
             "detail-type": "EC2 Spot Instance Interruption Warning", "time": "2026-11-20T14:02:00Z",
             "region": "us-east-1", "resources": [],
             "detail": {"instance-id": "i-0abc", "instance-action": "terminate"}}
    # Two threads for the views: the held polls must take none of them.
    app = _app(redis_url="", fast_poll_s=0.05, web_threads=2)

    async def scenario():
        status, body = await _call(app, method="GET", path=PATH, headers=headers)
        version = json.loads(body)["version"]
        polls = [asyncio.create_task(_call(app, method="GET", path=PATH, query=f"version={version}&wait=20",
                                           headers=headers)) for _ in range(100)]
        while app.waiters.held < 100:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        status, body = await _call(app, method="POST", path=f"/api/v1/webhooks/aws/eventbridge/{team.slug}/",
                                   headers={"Content-Type": "application/json", "x-api-key": key},
                                   body=json.dumps(event).encode())
        took = time.monotonic() - started
        still_held = app.waiters.held
        for poll in polls:
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        await app.waiters.close()
        return status, body, took, still_held

    with override_settings(REDIS_URL="", SPOTPIPE_NOTICE_HANDOFF="none"):
        status, body, took, still_held = asyncio.run(scenario())
    assert status == 202, body
    assert still_held == 100
    assert took < 2.0, took


def test_the_batched_answers_are_the_single_answers(agent):
    """What the channel sends after a wake-up (`agent_commands_many`) is what the view sends."""
    job, _ = agent
    ids = list(job.instances.values_list("pk", flat=True))
    before = services.agent_commands_many(instance_ids=ids)
    services.job_grow(job=job)
    after = services.agent_commands_many(instance_ids=[*ids, 10**9])
    assert set(after) == set(ids)
    for pk in ids:
        assert before[pk]["action"] == "idle" and after[pk]["action"] == "run"
        assert after[pk] == services.agent_commands(instance_id=pk)


def test_a_poll_that_times_out_gets_the_full_answer_of_its_version(agent):
    _, headers = agent
    app = _app(redis_url="", fast_poll_s=0.05)

    async def scenario():
        status, body = await _call(app, method="GET", path=PATH, headers=headers)
        first = json.loads(body)
        started = time.monotonic()
        status, body = await _call(app, method="GET", path=PATH, query=f"version={first['version']}&wait=0.4",
                                   headers=headers)
        took = time.monotonic() - started
        await app.waiters.close()
        return first, status, json.loads(body), took

    with override_settings(REDIS_URL=""):
        first, status, answer, took = asyncio.run(scenario())
    assert status == 200 and answer == first  # the same version, the whole answer (not the hold mark)
    assert 0.4 * 0.75 - 0.01 <= took < 2.0, took


HOSTILE_QUERIES = [
    "wait=abc", "wait=nan", "wait=inf", "wait=-1", "wait=1e400", f"wait={10**6}",
    "version=" + "v" * 5000, "version=%00", "wait=0.1&wait=abc", "version=x&wait=%ff",
    "version=%E2%9C%93&wait=0.2",  # accepted: a version never issued is stale, answered at once
]


@pytest.mark.parametrize("query", HOSTILE_QUERIES)
def test_hostile_poll_parameters_get_the_views_answer_through_the_channel(agent, query):
    """The channel's first step is the view: a bad `wait` or `version` is the view's 400 naming it,
    never a 500 or a hold; whatever the view accepts is answered at once or held within the cap."""
    _, headers = agent
    app = _app(redis_url="", fast_poll_s=0.05)
    client_view = Client(raise_request_exception=False)

    async def scenario():
        started = time.monotonic()
        answer = await asyncio.wait_for(_call(app, method="GET", path=PATH, query=query, headers=headers), 40)
        await app.waiters.close()
        return answer, time.monotonic() - started

    with override_settings(REDIS_URL=""):
        (status, body), _took = asyncio.run(scenario())
        expected = client_view.get(f"{PATH}?{query}", HTTP_AUTHORIZATION=headers["Authorization"])
    assert status < 500, body
    assert status == expected.status_code, (body, expected.content)
    if status == 400:
        named = json.loads(body)["errors"]
        assert set(named) & {"wait", "version"}, named
