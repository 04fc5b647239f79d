"""The heartbeat fast path of the ASGI entry point (controlplane/asgi.py,
controlplane/hotpaths/heartbeat_channel.py), driven in process: a plain heartbeat gets the view's
answer (status, headers, body) after its window's one UPDATE; every other request, and every
refusal, is the view's own answer; a revoked or expired token is refused at its next heartbeat; a
clean shutdown writes and answers what is pending; an acknowledged heartbeat is already written,
so the dead-node detector sees it."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from django.core.wsgi import get_wsgi_application
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.accounts.services import api_token_revoke
from controlplane.asgi import ControlPlane
from controlplane.fleet.models import Instance
from controlplane.fleet.services import instance_transition
from controlplane.hotpaths import heartbeat_channel
from controlplane.hotpaths.thread_pools import in_request
from controlplane.hotpaths.window_batches import WindowBatches
from controlplane.hotpaths.wsgi_bridge import read_body
from controlplane.orchestration.services import instances_detect_dead
from controlplane.wsgi import application as wsgi_application
from tests.controlplane.api_helpers import make_api_token, make_api_user
from tests.controlplane.factories import make_instance, make_job, make_team
from tests.orchestration.asgi_client import asgi_control_plane, asgi_request, capturing_sql, http_scope

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(path: str, headers: dict[str, str], *, method: str = "POST", query: str = "") -> dict:
    return http_scope(method=method, path=path, headers=headers, query=query)


async def _call(app, path: str, headers: dict[str, str], body: bytes = b"", **kwargs) -> tuple[int, dict, bytes]:
    """One request through the ASGI app: (status, headers, body)."""
    return await asgi_request(app, _scope(path, headers, **kwargs), body)


async def _view(app, path: str, headers: dict[str, str], body: bytes = b"", **kwargs) -> tuple[int, dict, bytes]:
    """The same request answered by the view (the WSGI application), bypassing the fast path."""

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    spooled = await read_body(receive)
    try:
        response = await app.bridge.call(_scope(path, headers, **kwargs), spooled)
    finally:
        spooled.close()
    return response.status, dict(response.headers), response.body


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
    user_key = make_api_token(team, user=make_api_user(team))
    return nodes, user_key


def _app(**kwargs) -> ControlPlane:
    return asgi_control_plane(wsgi_application, redis_url="", heartbeat_batch_s=kwargs.pop("heartbeat_batch_s", 0.02),
                        **kwargs)


def _url(instance: Instance) -> str:
    return f"/api/v1/instances/{instance.pk}/heartbeat/"


JSON = {"content-type": "application/json", "accept": "*/*"}


@pytest.mark.parametrize("body", [b"", b"{}", b'{"agent_address": ""}', "address"])
@pytest.mark.parametrize("keyword", ["Token", "Bearer"])
def test_a_plain_heartbeat_gets_the_views_answer(fleet, body, keyword):
    nodes, _ = fleet
    instance, key = nodes[0]
    Instance.objects.filter(pk=instance.pk).update(agent_address="10.0.0.5:7070")
    if body == "address":  # the address the instance already has: nothing to change
        body = b'{"agent_address": "10.0.0.5:7070"}'
    headers = {**JSON, "authorization": f"{keyword} {key}"}
    app = _app()

    async def scenario():
        fast = await _call(app, _url(instance), headers, body)
        view = await _view(app, _url(instance), headers, body)
        return fast, view

    before = timezone.now()
    (status, fast_headers, fast_body), (view_status, view_headers, view_body) = asyncio.run(scenario())
    assert app.heartbeats.answered == 1 and app.heartbeats.handed_over == 0
    assert status == view_status == 200, fast_body
    assert list(fast_headers) == list(view_headers)
    assert {k: v for k, v in fast_headers.items() if k != b"content-length"} == {
        k: v for k, v in view_headers.items() if k != b"content-length"}
    assert int(fast_headers[b"content-length"]) == len(fast_body)
    fast_json, view_json = json.loads(fast_body), json.loads(view_body)
    assert fast_json.keys() == view_json.keys()
    assert {k: v for k, v in fast_json.items() if k != "last_heartbeat_at"} == {
        k: v for k, v in view_json.items() if k != "last_heartbeat_at"}
    assert fast_json["state"] == "running" and fast_json["instance"] == instance.pk
    # The fast path's stamp was written before the answer, and the view's later one moved it on.
    fast_at = timezone.datetime.fromisoformat(fast_json["last_heartbeat_at"])
    assert before <= fast_at < timezone.datetime.fromisoformat(view_json["last_heartbeat_at"])
    instance.refresh_from_db()
    assert instance.agent_address == "10.0.0.5:7070"


def test_with_one_renderer_as_in_production_the_headers_are_still_the_views(fleet, monkeypatch):
    """Production has no browsable API: DRF then sends no `Vary: Accept`, and neither does the fast path."""
    from rest_framework.renderers import JSONRenderer

    from controlplane.fleet.api.views import InstanceViewSet

    nodes, _ = fleet
    instance, key = nodes[0]
    monkeypatch.setattr(InstanceViewSet, "renderer_classes", [JSONRenderer])
    heartbeat_channel.view_headers.cache_clear()
    headers = {**JSON, "authorization": f"Token {key}"}
    app = _app()

    async def scenario():
        return await _call(app, _url(instance), headers, b"{}"), await _view(app, _url(instance), headers, b"{}")

    try:
        (status, fast_headers, _), (view_status, view_headers, _) = asyncio.run(scenario())
    finally:
        heartbeat_channel.view_headers.cache_clear()
    assert status == view_status == 200 and app.heartbeats.answered == 1
    assert b"vary" not in view_headers
    assert [(k, v) for k, v in fast_headers.items() if k != b"content-length"] == [
        (k, v) for k, v in view_headers.items() if k != b"content-length"]


@pytest.mark.parametrize("secure", [False, True])
def test_https_rules_are_the_views(fleet, settings, secure):
    """SECURE_SSL_REDIRECT: a heartbeat over http gets the view's redirect; over https (as a proxy
    says) the fast path answers it, with the view's HSTS header."""
    nodes, _ = fleet
    instance, key = nodes[0]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    heartbeat_channel._middlewares.cache_clear()
    headers = {**JSON, "authorization": f"Token {key}", **({"x-forwarded-proto": "https"} if secure else {})}
    # Django's middlewares read these settings when they are built: a handler built after the change.
    app = asgi_control_plane(get_wsgi_application(), redis_url="", heartbeat_batch_s=0.02)

    async def scenario():
        return await _call(app, _url(instance), headers, b"{}"), await _view(app, _url(instance), headers, b"{}")

    try:
        (status, fast_headers, _), (view_status, view_headers, _) = asyncio.run(scenario())
    finally:
        heartbeat_channel._middlewares.cache_clear()
    assert status == view_status == (200 if secure else 301)
    assert app.heartbeats.answered == (1 if secure else 0)
    assert fast_headers.get(b"strict-transport-security") == view_headers.get(b"strict-transport-security")
    assert (b"strict-transport-security" in fast_headers) == secure


def _refusal_cases(nodes, user_key):
    (instance, key), (sibling, _) = nodes[0], nodes[1]
    agent = {**JSON, "authorization": f"Token {key}"}
    return {
        "no token": (_url(instance), {**JSON}, b"{}", {}),
        "unknown token": (_url(instance), {**JSON, "authorization": "Token sp_nonsense"}, b"{}", {}),
        "malformed header": (_url(instance), {**JSON, "authorization": f"Token {key} extra"}, b"{}", {}),
        "user token": (_url(instance), {**JSON, "authorization": f"Token {user_key}"}, b"{}", {}),
        "another instance's token": (_url(sibling), agent, b"{}", {}),
        "no such instance": ("/api/v1/instances/999999/heartbeat/", agent, b"{}", {}),
        "address too long": (_url(instance), agent, json.dumps({"agent_address": "x" * 201}).encode(), {}),
        "address not a string": (_url(instance), agent, b'{"agent_address": ["10.0.0.5"]}', {}),
        "not JSON": (_url(instance), agent, b"{", {}),
        "JSON nested too deeply": (_url(instance), agent, b"[" * 1000, {}),
        "GET": (_url(instance), agent, b"", {"method": "GET"}),
        "a host not allowed": (_url(instance), {**agent, "host": "evil.example.org"}, b"{}", {}),
    }


@pytest.mark.parametrize("case", [
    "no token", "unknown token", "malformed header", "user token", "another instance's token", "no such instance",
    "address too long", "address not a string", "not JSON", "JSON nested too deeply", "GET",
    "a host not allowed"])
def test_everything_but_a_plain_heartbeat_gets_the_views_own_answer(fleet, case, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    nodes, user_key = fleet
    path, headers, body, kwargs = _refusal_cases(nodes, user_key)[case]
    app = _app()

    async def scenario():
        return await _call(app, path, headers, body, **kwargs), await _view(app, path, headers, body, **kwargs)

    (status, fast_headers, fast_body), (view_status, view_headers, view_body) = asyncio.run(scenario())
    assert app.heartbeats.answered == 0
    assert status == view_status and status >= 400, (status, fast_body)
    assert fast_body == view_body and fast_headers == view_headers
    assert Instance.objects.filter(pk__in=[n.pk for n, _ in nodes], last_heartbeat_at__isnull=False).count() == 0


@pytest.mark.parametrize(("content_type", "body", "query"), [
    ("application/json", b'{"agent_address": "10.0.0.9:7070"}', ""),
    ("application/x-www-form-urlencoded", b"agent_address=10.0.0.9:7070", ""),
    ("application/json", b'{"agent_address": "10.0.0.9:7070"}', "format=json"),
])
def test_a_new_address_or_a_query_string_goes_to_the_view(fleet, content_type, body, query):
    nodes, _ = fleet
    instance, key = nodes[0]
    if query:  # the address it has already: only the query string keeps it from the fast path
        Instance.objects.filter(pk=instance.pk).update(agent_address="10.0.0.9:7070")
    app = _app()
    status, _, body = asyncio.run(_call(app, _url(instance), {**JSON, "content-type": content_type,
                                                               "authorization": f"Token {key}"}, body, query=query))
    assert status == 200, body
    assert app.heartbeats.answered == 0  # the view's answer
    assert app.heartbeats.handed_over == (0 if query or content_type != "application/json" else 1)
    instance.refresh_from_db()
    assert instance.agent_address == "10.0.0.9:7070" and instance.last_heartbeat_at is not None


@pytest.mark.parametrize("how", ["revoked", "expired", "instance ended"])
def test_a_token_revoked_or_expired_is_refused_at_its_next_heartbeat(fleet, how):
    nodes, _ = fleet
    instance, key = nodes[0]
    headers = {**JSON, "authorization": f"Token {key}"}
    token = ApiToken.objects.get(instance=instance, revoked_at__isnull=True)
    app = _app()

    async def scenario():
        first = await _call(app, _url(instance), headers, b"{}")
        if how == "revoked":
            await asyncio.to_thread(api_token_revoke, token=token)
        elif how == "expired":
            await asyncio.to_thread(lambda: ApiToken.objects.filter(pk=token.pk).update(
                expires_at=timezone.now() - timedelta(seconds=1)))
        else:
            await asyncio.to_thread(instance_transition, instance=instance, to="terminated")
        stamp = await asyncio.to_thread(lambda: Instance.objects.get(pk=instance.pk).last_heartbeat_at)
        await asyncio.sleep(heartbeat_channel.MIN_INTERVAL_S)  # not the flood guard's doing
        second = await _call(app, _url(instance), headers, b"{}")
        return first, stamp, second

    first, stamp, second = asyncio.run(scenario())
    assert first[0] == 200 and app.heartbeats.answered == 1
    assert second[0] == 401, second
    assert json.loads(second[2])["detail"] == "invalid, revoked or expired token"
    assert app.heartbeats.handed_over == 1
    assert Instance.objects.get(pk=instance.pk).last_heartbeat_at == stamp  # nothing written after


def test_a_window_of_heartbeats_is_one_update(fleet):
    nodes, _ = fleet
    app = _app(heartbeat_batch_s=0.2)
    capturing, statements = capturing_sql(heartbeat_channel.record_and_render)
    app.heartbeats.record_batch = lambda claims: in_request(capturing, claims)

    async def scenario():
        return await asyncio.gather(*(_call(app, _url(instance), {**JSON, "authorization": f"Token {key}"}, b"{}")
                                      for instance, key in nodes))

    before = timezone.now()
    answers = asyncio.run(scenario())
    assert [status for status, _, _ in answers] == [200] * len(nodes)
    assert app.heartbeats.flushes == 1 and app.heartbeats.answered == len(nodes)
    (batch,) = statements
    updates = [sql for sql in batch if sql.startswith("UPDATE") and "fleet_instance" in sql.split("SET")[0]]
    assert len(updates) == 1, batch
    # The token read, the UPDATE, the first touch of the tokens' last_used_at: three, not 60.
    assert len(batch) == 3, batch
    stamps = dict(Instance.objects.filter(pk__in=[i.pk for i, _ in nodes]).values_list("pk", "last_heartbeat_at"))
    for (instance, _), (_, _, body) in zip(nodes, answers, strict=True):
        assert stamps[instance.pk] >= before
        assert timezone.datetime.fromisoformat(json.loads(body)["last_heartbeat_at"]) == stamps[instance.pk]
    assert ApiToken.objects.filter(instance__in=[i for i, _ in nodes], last_used_at__isnull=True).count() == 0


def test_a_flood_from_one_agent_goes_to_the_view():
    """More than one heartbeat per instance per MIN_INTERVAL_S: the rest are the view's (and its throttle's)."""
    batches = WindowBatches(record_batch=lambda c: [], executor=None, window_s=0.1,
                            min_interval_s=heartbeat_channel.MIN_INTERVAL_S)
    assert batches.admit(7) and not batches.admit(7) and batches.admit(8)


def test_a_clean_shutdown_writes_and_answers_pending_heartbeats(fleet):
    nodes, _ = fleet
    instance, key = nodes[0]
    app = _app(heartbeat_batch_s=60)  # only the shutdown can flush it in time

    async def scenario():
        beat = asyncio.create_task(_call(app, _url(instance), {**JSON, "authorization": f"Token {key}"}, b"{}"))
        while not app.heartbeats.pending:
            await asyncio.sleep(0.01)
        lifespan = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        said = []

        async def receive():
            return lifespan.pop(0)

        async def send(message):
            said.append(message["type"])

        await asyncio.wait_for(app(({"type": "lifespan"}), receive, send), 10)
        return await asyncio.wait_for(beat, 5), said

    (status, _, body), said = asyncio.run(scenario())
    assert said == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert status == 200, body
    stamp = Instance.objects.get(pk=instance.pk).last_heartbeat_at
    assert stamp is not None and stamp.isoformat().replace("+00:00", "Z") == json.loads(body)["last_heartbeat_at"]


def test_a_node_heartbeating_through_the_fast_path_is_not_declared_dead(fleet):
    """Its last stamp is 3 s old; one heartbeat answered by the fast path, and the detector (2 s
    timeout) finds it alive: the answer came after the write."""
    nodes, _ = fleet
    instance, key = nodes[0]
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=3))
    app = _app()
    status, _, _ = asyncio.run(_call(app, _url(instance), {**JSON, "authorization": f"Token {key}"}, b"{}"))
    assert status == 200 and app.heartbeats.answered == 1
    lost = instances_detect_dead(timeout_s=2.0)
    assert instance.pk not in lost
    assert Instance.objects.get(pk=instance.pk).state == "running"


def test_a_request_the_fast_path_cannot_read_goes_to_the_view(fleet, monkeypatch):
    nodes, _ = fleet
    instance, key = nodes[0]

    def broken(*args):
        raise RuntimeError("a reader bug")

    monkeypatch.setattr(heartbeat_channel, "heartbeat_claim", broken)
    app = _app()
    status, _, body = asyncio.run(_call(app, _url(instance), {**JSON, "authorization": f"Token {key}"}, b"{}"))
    assert status == 200, body  # the view's answer, not a 500
    assert app.heartbeats.answered == 0 and app.heartbeats.handed_over == 0
    assert Instance.objects.get(pk=instance.pk).last_heartbeat_at is not None
