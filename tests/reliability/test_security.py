"""CSRF on session writes, rate limits on login and webhooks, and secrets kept out of logs and
error pages."""

from __future__ import annotations

import json
import logging
import secrets

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import include, path

from controlplane.accounts.models import ApiToken
from controlplane.jobs.models import TrainingJob
from tests.controlplane.factories import make_user, make_webhook_credential
from tests.reliability.world import make_world

pytestmark = pytest.mark.django_db

RATELIMIT = "controlplane.observability.ratelimit.RateLimitMiddleware"


def test_rate_limit_runs_before_sessions():
    # Before sessions, so a refused request costs no session or database work.
    middleware = settings.MIDDLEWARE
    assert RATELIMIT in middleware
    assert middleware.index(RATELIMIT) < middleware.index("django.contrib.sessions.middleware.SessionMiddleware")


# --- CSRF --------------------------------------------------------------------------------------


def _csrf_token(client: Client, page: str = "/jobs/new/") -> str:
    client.get(page)
    return client.cookies[settings.CSRF_COOKIE_NAME].value


@pytest.mark.parametrize(("url", "data", "content_type"), [
    ("/jobs/{job}/cancel/", {}, None),
    ("/team/{slug}/tokens/", {"name": "csrf"}, None),
    ("/api/v1/jobs/{job}/cancel/", {}, "application/json"),
    ("/api/v1/tokens/", {"team": "{team}", "kind": "user", "name": "csrf"}, "application/json"),
])
def test_session_writes_need_the_csrf_token(url, data, content_type):
    world = make_world()
    ids = world.ids()
    url = url.format(**ids)
    data = {k: (int(v.format(**ids)) if k == "team" else v) for k, v in data.items()}
    payload = json.dumps(data) if content_type else data
    kwargs = {"content_type": content_type} if content_type else {}
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.admin_a)
    tokens_before = ApiToken.objects.count()

    refused = client.post(url, payload, **kwargs)
    assert refused.status_code == 403, (url, refused.status_code, refused.content[:200])
    assert b"CSRF" in refused.content
    assert TrainingJob.objects.get(pk=world.job.pk).status == "pending"
    assert ApiToken.objects.count() == tokens_before

    # The same request with the token goes through: the 403 above was CSRF, not authorization.
    accepted = client.post(url, payload, HTTP_X_CSRFTOKEN=_csrf_token(client), **kwargs)
    assert accepted.status_code in {200, 201, 302}, (url, accepted.status_code, accepted.content[:200])


def test_token_authenticated_api_writes_need_no_csrf_token():
    """A bearer token cannot be sent by a browser on its own, so token writes are CSRF-exempt."""
    world = make_world()
    client = world.api_client("admin_a", enforce_csrf_checks=True)
    response = client.post(f"/api/v1/jobs/{world.job.pk}/cancel/", {}, content_type="application/json")
    assert response.status_code == 200


# --- rate limits -------------------------------------------------------------------------------


def _fresh_ip() -> str:
    """A client address no earlier run has used: counts live in the cache (maybe a shared Redis),
    which the tests must not clear."""
    n = secrets.randbelow(2**24)
    return f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}"


@pytest.fixture
def ratelimited(monkeypatch):
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_LOGIN", "5")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WEBHOOKS", "8")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WINDOW_S", "3600")  # no window boundary inside the test
    yield


def test_login_is_rate_limited_per_client_ip(ratelimited):
    make_user(username="ada")
    client = Client()
    ip, other_ip = _fresh_ip(), _fresh_ip()
    statuses = [client.post("/accounts/login/", {"username": "ada", "password": f"guess-{i}"},
                            REMOTE_ADDR=ip).status_code for i in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    refused = client.post("/accounts/login/", {"username": "ada", "password": "correct-horse-battery-staple"},
                          REMOTE_ADDR=ip)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "_auth_user_id" not in client.session  # refused before authentication, even with the right password
    # Another address is counted on its own, and GET (the form) is not limited.
    assert client.get("/accounts/login/", REMOTE_ADDR=ip).status_code == 200
    ok = client.post("/accounts/login/", {"username": "ada", "password": "correct-horse-battery-staple"},
                     REMOTE_ADDR=other_ip)
    assert ok.status_code == 302


def test_webhooks_are_rate_limited_per_client_ip(ratelimited):
    world = make_world()
    url = f"/api/v1/webhooks/aws/eventbridge/{world.team_a.slug}/"
    client = Client()
    ip = _fresh_ip()
    statuses = [client.post(url, "{}", content_type="application/json", REMOTE_ADDR=ip).status_code
                for _ in range(10)]
    assert statuses == [401] * 8 + [429] * 2
    assert client.post(url, "{}", content_type="application/json", REMOTE_ADDR=_fresh_ip()).status_code == 401
    # The API outside webhooks is not limited by these rules.
    api = world.api_client("member_a")
    assert all(api.get("/api/v1/jobs/", REMOTE_ADDR=ip).status_code == 200 for _ in range(10))


def test_default_limits_leave_room_for_the_webhook_benchmark(monkeypatch):
    """1,000 notices/s from one client for a few seconds fits the default webhook limit."""
    from controlplane.observability import ratelimit

    for name in ("SPOTPIPE_RATELIMIT_LOGIN", "SPOTPIPE_RATELIMIT_WEBHOOKS", "SPOTPIPE_RATELIMIT_WINDOW_S"):
        monkeypatch.delenv(name, raising=False)
    rules = {rule.name: rule for rule in ratelimit.rules()}
    assert rules["webhooks"].limit >= 1000 * 5 and ratelimit.window_s() == 60
    assert rules["login"].limit == 20
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WEBHOOKS", "0")
    assert {r.name: r for r in ratelimit.rules()}["webhooks"].limit == 0  # 0 disables the rule


# --- secrets stay out of logs and error bodies -------------------------------------------------


def _boom(request):
    raise RuntimeError("boom")


urlpatterns = [path("boom/", _boom), path("", include(settings.ROOT_URLCONF))]


def _assert_absent(secrets: list[str], *texts: str) -> None:
    for secret in secrets:
        for text in texts:
            assert secret not in text, f"secret {secret[:6]}... leaked into: {text[:300]!r}"


@pytest.mark.parametrize("debug", [False, True])
def test_secrets_never_reach_logs_or_error_bodies(caplog, debug):
    caplog.set_level(logging.DEBUG)
    world = make_world()
    key = world.keys["member_a"]
    _, webhook_secret = make_webhook_credential(world.team_a, "aws_eventbridge", "api_key", header_name="x-api-key")
    password = "correct-horse-battery-staple"
    user = make_user(world.team_a, username="grace")
    bodies: list[str] = []

    with override_settings(DEBUG=debug, ROOT_URLCONF=__name__):
        client = Client(raise_request_exception=False)
        # A 500 with a token and a webhook secret in the headers (DEBUG shows the technical page).
        boom = client.get("/boom/", HTTP_AUTHORIZATION=f"Token {key}", HTTP_X_API_KEY=webhook_secret)
        assert boom.status_code == 500
        bodies.append(boom.content.decode(errors="replace"))
        # Token auth: a good key on a 404, a mangled key (401), a 400.
        api = Client(HTTP_AUTHORIZATION=f"Token {key}")
        for response in (
            api.get("/api/v1/jobs/999999999/"),
            Client(HTTP_AUTHORIZATION=f"Token {key}x").get("/api/v1/jobs/"),
            api.post("/api/v1/jobs/", {"name": ""}, content_type="application/json"),
        ):
            assert response.status_code in {400, 401, 404}
            bodies.append(response.content.decode(errors="replace"))
        # Creating a token shows the new key once, in the 201 body only; it must not be logged.
        created = world.api_client("admin_a").post(
            "/api/v1/tokens/", {"team": world.team_a.pk, "kind": "user", "name": "new"},
            content_type="application/json")
        assert created.status_code == 201
        new_key = created.json()["key"]
        # Webhooks: right secret, wrong secret (401).
        url = f"/api/v1/webhooks/aws/eventbridge/{world.team_a.slug}/"
        for secret in (webhook_secret, webhook_secret[:-2] + "zz"):
            response = client.post(url, "{}", content_type="application/json", HTTP_X_API_KEY=secret)
            if response.status_code >= 400:
                bodies.append(response.content.decode(errors="replace"))
        # Login: wrong password (form again, 200), then the right one.
        wrong = client.post("/accounts/login/", {"username": "grace", "password": password + "!"})
        assert wrong.status_code == 200
        bodies.append(wrong.content.decode(errors="replace"))
        assert client.post("/accounts/login/", {"username": user.username, "password": password}).status_code == 302

    logs = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.__dict__}" for r in caplog.records)
    assert logs, "expected the 500 and 4xx to be logged"
    _assert_absent([key, webhook_secret, new_key, password], logs, *bodies)


def test_webhooks_accept_only_the_teams_own_credential():
    """A team's webhook key authenticates its own URL only; API tokens are no webhook credential."""
    world = make_world()
    _, key_a = make_webhook_credential(world.team_a, "aws_eventbridge", "api_key", header_name="x-api-key")
    client = Client()
    url_a = f"/api/v1/webhooks/aws/eventbridge/{world.team_a.slug}/"
    url_b = f"/api/v1/webhooks/aws/eventbridge/{world.team_b.slug}/"
    own = client.post(url_a, "{}", content_type="application/json", HTTP_X_API_KEY=key_a)
    assert own.status_code == 400, own.content  # authenticated; the empty event is refused as input
    assert client.post(url_b, "{}", content_type="application/json", HTTP_X_API_KEY=key_a).status_code == 401
    token = client.post(url_a, "{}", content_type="application/json",
                        HTTP_AUTHORIZATION=f"Token {world.keys['admin_a']}")
    assert token.status_code == 401
