"""The batched first step of the agents' command long-poll (controlplane/asgi.py,
controlplane/hotpaths/poll_channel.py), driven in process: a plain poll is held when its
version is current and answered at once when stale, exactly as through the view's first step
(status, headers, body); a window of polls is one read of their tokens and versions; every other
request, and every refusal, is the view's own answer; a revoked token is refused at its next poll
right after the revocation committed; a poll held by this path is still released by a wake-up."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.accounts.services import api_token_revoke
from controlplane.asgi import ControlPlane
from controlplane.common import agent_wake
from controlplane.fleet.services import instance_transition
from controlplane.hotpaths import poll_channel
from controlplane.hotpaths.thread_pools import in_request
from controlplane.orchestration import selectors, services
from controlplane.wsgi import application as wsgi_application
from tests.controlplane.api_helpers import make_api_token, make_api_user
from tests.controlplane.factories import make_instance, make_job, make_team
from tests.orchestration.asgi_client import asgi_control_plane, asgi_request, capturing_sql, http_scope
from tests.orchestration.test_agent_channel import agent  # noqa: F401  (the fixture: a started job's agent)

pytestmark = pytest.mark.django_db(transaction=True)

PATH = poll_channel.URL
REDIS_URL = os.environ.get("REDIS_URL", "")


def _scope(headers: dict[str, str], query: str, *, method: str = "GET", path: str = PATH) -> dict:
    return http_scope(method=method, path=path, headers=headers, query=query)


async def _call(app, headers: dict[str, str], query: str, body: bytes = b"", **kwargs) -> tuple[int, dict, bytes]:
    """One request through the ASGI app, the client connected until it has its answer: (status, headers, body)."""
    return await asgi_request(app, _scope(headers, query, **kwargs), body)


def _app(**kwargs) -> ControlPlane:
    return asgi_control_plane(wsgi_application, redis_url=kwargs.pop("redis_url", ""),
                        fast_poll_s=kwargs.pop("fast_poll_s", 0.05), poll_batch_s=kwargs.pop("poll_batch_s", 0.02),
                        **kwargs)


def _view_app() -> ControlPlane:
    """The same server with the batched first step switched off: every poll's first step is the view's."""
    app = _app()
    app.polls.admit = lambda key: False
    return app


@pytest.fixture
def fleet():
    """A team with a user token, and a job of 20 running instances, each with its agent token."""
    team = make_team()
    job = make_job(team)
    nodes = []
    for _ in range(20):
        instance = make_instance(team, job=job)
        instance_transition(instance=instance, to="running")
        nodes.append((instance, make_api_token(team, instance=instance)))
    return nodes, make_api_token(team, user=make_api_user(team))


def _version(instance) -> str:
    return selectors.agent_command_version(instance_id=instance.pk)[0]


def _query(version: str, wait: str = "0.3") -> str:
    return f"version={version.replace(':', '%3A')}&wait={wait}"  # as the agent's HTTP client encodes it


def _without_length(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k != b"content-length"}


@pytest.mark.parametrize("current", [True, False])
@pytest.mark.parametrize("keyword", ["Token", "Bearer"])
def test_a_plain_poll_gets_what_the_views_first_step_gives(fleet, current, keyword):
    """Current version: held (then the full answer at the end of its wait), as a poll the view marked.
    Stale: the view's answer at once."""
    nodes, _ = fleet
    instance, key = nodes[0]
    headers = {"accept": "*/*", "authorization": f"{keyword} {key}"}
    # A stale poll asks to be held for 5 s: answered at once, it is told from a held one by seconds,
    # not by 0.2 s that a loaded machine can spend on any request.
    query = _query(_version(instance), "0.3") if current else _query("pending:1:None:None", "5")
    fast_app, view_app = _app(), _view_app()

    async def timed(app):
        started = time.monotonic()
        answer = await _call(app, headers, query)
        return answer, time.monotonic() - started

    async def scenario():
        fast = await timed(fast_app)
        view = await timed(view_app)
        await fast_app.waiters.close()
        await view_app.waiters.close()
        return fast, view

    ((status, fast_headers, fast_body), fast_took), ((view_status, view_headers, view_body), view_took) = (
        asyncio.run(scenario()))
    assert fast_app.polls.answered == 1 and fast_app.polls.handed_over == 0
    assert view_app.polls.answered == 0
    assert status == view_status == 200, fast_body
    assert json.loads(fast_body) == json.loads(view_body) == services.agent_commands(instance_id=instance.pk)
    assert fast_body == view_body
    assert _without_length(fast_headers) == _without_length(view_headers)
    assert int(fast_headers[b"content-length"]) == len(fast_body)
    if current:  # held for its wait (less up to 25%), both ways
        assert min(fast_took, view_took) >= 0.3 * 0.75 - 0.01
    else:  # answered at once (the window of 0.02 s), not held for its 5 s (at least 3.75 s)
        assert fast_took < 1.0 and view_took < 1.0
    if not current:
        assert list(fast_headers) == list(view_headers)  # the view's own 200, in its order


def test_a_poll_on_its_current_version_parks_in_the_hub(fleet):
    nodes, _ = fleet
    instance, key = nodes[0]
    app = _app()
    query = _query(_version(instance), "5")

    async def scenario():
        poll = asyncio.create_task(_call(app, {"authorization": f"Token {key}"}, query))
        while app.waiters.held == 0:
            await asyncio.sleep(0.01)
        held, answered = app.waiters.held, app.polls.answered
        poll.cancel()
        await app.waiters.close()
        return held, answered

    held, answered = asyncio.run(scenario())
    assert held == 1 and answered == 1


def test_a_window_of_polls_is_one_read_of_their_tokens_and_versions(fleet):
    nodes, _ = fleet
    app = _app(poll_batch_s=0.2)
    capturing, statements = capturing_sql(poll_channel.first_steps)
    app.polls.record_batch = lambda claims: in_request(capturing, claims)
    # The first 5 hold a version never issued: answered at once, together; the others are held.
    queries = [_query("idle:0:None:None" if n < 5 else _version(instance), "0.2")
               for n, (instance, _) in enumerate(nodes)]

    async def scenario():
        answers = await asyncio.gather(*(_call(app, {"authorization": f"Token {key}"}, query)
                                         for (_, key), query in zip(nodes, queries, strict=True)))
        await app.waiters.close()
        return answers

    answers = asyncio.run(scenario())
    assert [status for status, _, _ in answers] == [200] * len(nodes)
    assert app.polls.flushes == 1 and app.polls.answered == len(nodes)
    (batch,) = statements
    reads = [sql for sql in batch if "accounts_apitoken" in sql and sql.startswith("SELECT")]
    assert len(reads) == 1, batch  # tokens, instances, jobs: the versions of all 20
    touches = [sql for sql in batch if sql.startswith("UPDATE")]
    assert len(touches) == 1, batch  # their first last_used_at, all at once
    # The answers of the 5 stale polls: agent_commands_many's one read (no generation yet), not 5 views' worth.
    assert len(batch) == 3, batch
    for (instance, _), (_, _, body) in zip(nodes, answers, strict=True):
        assert json.loads(body) == services.agent_commands(instance_id=instance.pk)
    assert ApiToken.objects.filter(instance__in=[i for i, _ in nodes], last_used_at__isnull=True).count() == 0


def _odd_cases(nodes, user_key) -> dict[str, tuple[dict[str, str], str, bytes, dict]]:
    (instance, key), (other, other_key) = nodes[0], nodes[1]
    plain = {"accept": "*/*", "authorization": f"Token {key}"}
    current = _query(_version(instance))
    return {
        "no token": ({"accept": "*/*"}, current, b"", {}),
        "unknown token": ({"authorization": "Token sp_nonsense"}, current, b"", {}),
        "malformed header": ({"authorization": f"Token {key} extra"}, current, b"", {}),
        "user token": ({"authorization": f"Token {user_key}"}, current, b"", {}),
        "token of an instance in another team": ({"authorization": f"Token {other_key}"},
                                                 _query(_version(other)), b"", {}),
        "wait=0": (plain, _query(_version(instance), "0"), b"", {}),
        "no wait": (plain, f"version={_version(instance)}", b"", {}),
        "no version": (plain, "wait=0.3", b"", {}),
        "another parameter": (plain, current + "&format=json", b"", {}),
        "a repeated parameter": (plain, current + "&wait=0.2", b"", {}),
        "a version the view trims": (plain, "version=%20" + _query(_version(instance))[len("version="):], b"", {}),
        "wait over the cap": (plain, _query(_version(instance), "61"), b"", {}),
        "wait in exponent form": (plain, _query(_version(instance), "3e-1"), b"", {}),
        "a body": ({**plain, "content-type": "application/json", "content-length": "2"}, current, b"{}", {}),
        "a cookie": ({**plain, "cookie": "sessionid=x"}, current, b"", {}),
        "an HTML Accept": ({**plain, "accept": "text/html"}, current, b"", {}),
        "a host not allowed": ({**plain, "host": "evil.example.org"}, current, b"", {}),
    }


ODD_CASES = ["no token", "unknown token", "malformed header", "user token", "token of an instance in another team",
             "wait=0", "no wait", "no version", "another parameter", "a repeated parameter",
             "a version the view trims", "wait over the cap", "wait in exponent form", "a body", "a cookie",
             "an HTML Accept", "a host not allowed"]


@pytest.mark.parametrize("case", ODD_CASES)
def test_everything_but_a_plain_poll_gets_the_views_own_answer(fleet, case, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    nodes, user_key = fleet
    if case == "token of an instance in another team":  # a token whose instance is not its team's
        ApiToken.objects.filter(instance=nodes[1][0]).update(team=make_team())
    headers, query, body, kwargs = _odd_cases(nodes, user_key)[case]
    fast_app, view_app = _app(), _view_app()

    async def scenario():
        fast = await _call(fast_app, headers, query, body, **kwargs)
        view = await _call(view_app, headers, query, body, **kwargs)
        await fast_app.waiters.close()
        await view_app.waiters.close()
        return fast, view

    (status, fast_headers, fast_body), (view_status, view_headers, view_body) = asyncio.run(scenario())
    assert fast_app.polls.answered == 0
    assert status == view_status, (status, fast_body, view_body)
    if case == "an HTML Accept":  # the browsable API's page (its CSRF token differs per render)
        assert fast_headers[b"content-type"] == view_headers[b"content-type"] == b"text/html; charset=utf-8"
    else:
        assert fast_body == view_body and _without_length(fast_headers) == _without_length(view_headers)


@pytest.mark.parametrize("how", ["revoked", "expired", "instance ended"])
def test_a_token_revoked_or_expired_is_refused_right_after(fleet, how):
    """A poll answered by the batched path, the token revoked (expired, its instance ended), and the
    next poll right after the commit: the view's 401, nothing cached."""
    nodes, _ = fleet
    instance, key = nodes[0]
    headers = {"authorization": f"Token {key}"}
    token = ApiToken.objects.get(instance=instance, revoked_at__isnull=True)
    app = _app()

    async def scenario():
        first = await _call(app, headers, _query("idle:0:None:None"))  # stale: answered at once
        if how == "revoked":
            await asyncio.to_thread(api_token_revoke, token=token)
        elif how == "expired":
            await asyncio.to_thread(lambda: ApiToken.objects.filter(pk=token.pk).update(
                expires_at=timezone.now() - timedelta(seconds=1)))
        else:  # ending an instance revokes its token
            await asyncio.to_thread(instance_transition, instance=instance, to="terminated")
        await asyncio.sleep(poll_channel.MIN_INTERVAL_S)  # not the flood guard's doing
        second = await _call(app, headers, _query("idle:0:None:None"))
        await app.waiters.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert first[0] == 200 and app.polls.answered == 1
    assert second[0] == 401, second
    assert json.loads(second[2])["detail"] == "invalid, revoked or expired token"
    assert app.polls.handed_over == 1


def test_a_flood_from_one_token_goes_to_the_view(fleet):
    nodes, _ = fleet
    _, key = nodes[0]
    app = _app()

    async def scenario():
        answers = await asyncio.gather(*(_call(app, {"authorization": f"Token {key}"}, _query("idle:0:None:None"))
                                         for _ in range(3)))
        await app.waiters.close()
        return answers

    answers = asyncio.run(scenario())
    assert [a[0] for a in answers] == [200] * 3 and len({a[2] for a in answers}) == 1
    assert app.polls.answered == 1  # the other two: the view's (and its throttle's)


def test_a_request_the_batched_path_cannot_read_goes_to_the_view(fleet, monkeypatch):
    nodes, _ = fleet
    instance, key = nodes[0]

    def broken(*args):
        raise RuntimeError("a reader bug")

    monkeypatch.setattr(poll_channel, "poll_claim", broken)
    app = _app()
    status, _, body = asyncio.run(_call(app, {"authorization": f"Token {key}"}, _query("idle:0:None:None")))
    assert status == 200, body  # the view's answer, not a 500
    assert json.loads(body) == services.agent_commands(instance_id=instance.pk)
    assert app.polls.answered == 0 and app.polls.handed_over == 0


def test_a_failed_batch_goes_to_the_view(fleet):
    nodes, _ = fleet
    instance, key = nodes[0]
    app = _app()

    def failing(claims):
        raise RuntimeError("the database went away")

    app.polls.record_batch = failing
    status, _, body = asyncio.run(_call(app, {"authorization": f"Token {key}"}, _query("idle:0:None:None")))
    assert status == 200 and json.loads(body) == services.agent_commands(instance_id=instance.pk)
    assert app.polls.handed_over == 1


async def _released_by_a_new_generation(app: ControlPlane, job, headers) -> tuple[float, dict]:
    """A poll on the current version, held by the batched path; the first generation; its release."""
    status, _, body = await _call(app, headers, "version=&wait=0.5")  # stale: the whole answer at once
    assert status == 200, body
    first = json.loads(body)
    assert first["action"] == "idle"
    # An agent re-polls at once; the window here (0.02 s) is shorter than the flood guard's interval.
    await asyncio.sleep(poll_channel.MIN_INTERVAL_S)
    poll = asyncio.create_task(_call(app, headers, _query(first["version"], "10")))
    while app.waiters.held == 0:
        await asyncio.sleep(0.01)
    assert app.polls.answered == 2  # both first steps were the batched path's
    started = time.monotonic()
    await sync_to_async(services.job_grow, thread_sensitive=False)(job=job)
    status, _, body = await poll
    assert status == 200, body
    return time.monotonic() - started, json.loads(body)


def test_a_poll_held_by_the_batched_path_is_released_by_the_database_poll(agent):  # noqa: F811
    job, headers = agent
    app = _app(fast_poll_s=0.05)

    async def scenario():
        result = await _released_by_a_new_generation(app, job, headers)
        await app.waiters.close()
        return result

    with override_settings(REDIS_URL=""):
        released_in, answer = asyncio.run(scenario())
    assert answer["action"] == "run" and answer["generation"]["number"] == 1
    assert released_in < 2.0, released_in  # its wait was 10 s


@pytest.mark.skipif(not REDIS_URL, reason="the Redis wake-up needs REDIS_URL (set in CI's PostgreSQL + Redis pass)")
def test_a_poll_held_by_the_batched_path_is_released_by_the_redis_wake_up(agent):  # noqa: F811
    job, headers = agent
    app = _app(redis_url=REDIS_URL, fast_poll_s=30, slow_poll_s=30)  # only the message can release it in time
    agent_wake._client = None

    async def scenario():
        starter = asyncio.create_task(app.waiters.wait(instance_id=-1, job_id=None, version="", timeout_s=0.5))
        while not app.waiters.subscribed:
            await asyncio.sleep(0.01)
        await starter
        result = await _released_by_a_new_generation(app, job, headers)
        await app.waiters.close()
        return result

    with override_settings(REDIS_URL=REDIS_URL):
        released_in, answer = asyncio.run(scenario())
    agent_wake._client = None
    assert answer["action"] == "run" and answer["generation"]["number"] == 1
    assert released_in < 2.0, released_in


def test_with_one_renderer_as_in_production_the_headers_are_still_the_views(fleet, monkeypatch):
    """Production has no browsable API: DRF then sends no `Vary: Accept`, and neither does the batched path."""
    from rest_framework.renderers import JSONRenderer

    from controlplane.hotpaths import heartbeat_channel
    from controlplane.orchestration.api.views import CommandsView

    nodes, _ = fleet
    _, key = nodes[0]
    monkeypatch.setattr(CommandsView, "renderer_classes", [JSONRenderer])
    heartbeat_channel.view_headers.cache_clear()
    fast_app, view_app = _app(), _view_app()

    async def scenario():
        query = _query("idle:0:None:None")
        return (await _call(fast_app, {"authorization": f"Token {key}"}, query),
                await _call(view_app, {"authorization": f"Token {key}"}, query))

    try:
        (status, fast_headers, fast_body), (view_status, view_headers, view_body) = asyncio.run(scenario())
    finally:
        heartbeat_channel.view_headers.cache_clear()
    assert status == view_status == 200 and fast_app.polls.answered == 1
    assert b"vary" not in view_headers
    assert list(fast_headers.items()) == list(view_headers.items()) and fast_body == view_body
