"""The WSGI entry point sends /api/v1/webhooks/ through the shorter webhook middleware stack and
everything else through the site's full stack (controlplane/hotpaths/webhook_dispatch.py)."""

from __future__ import annotations

import io
import json
import sys

import pytest
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext

from controlplane.fleet.models import InterruptionNotice
from controlplane.fleet.notices import NoticeDraft, notices_store
from controlplane.hotpaths.webhook_dispatch import WEBHOOK_MIDDLEWARE, WebhookDispatch
from controlplane.hotpaths.wsgi_environ import DropProcessEnviron
from controlplane.webhooks.credentials import credentials_cache_clear
from controlplane.wsgi import application
from tests.controlplane.factories import make_team, make_webhook_credential
from tests.reliability.test_security import _fresh_ip

pytestmark = pytest.mark.django_db

EVENT = {
    "version": "0", "id": "wsgi-ev-1", "source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning",
    "account": "123456789012", "time": "2026-11-20T14:02:00Z", "region": "us-east-1", "resources": [],
    "detail": {"instance-id": "i-0123456789abcdef0", "instance-action": "terminate"},
}


@pytest.fixture(autouse=True)
def _in_test_transaction(settings):
    """Requests run inside the test's transaction: keep Django from closing the connection at the
    start and end of each request (as the test client does)."""
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"
    credentials_cache_clear()
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)
    credentials_cache_clear()


def call(method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, dict[str, str], bytes]:
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
        "SERVER_NAME": "testserver", "SERVER_PORT": "80", "REMOTE_ADDR": "10.9.8.7", "HTTP_HOST": "testserver",
        "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http",
        "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.errors": sys.stderr, "wsgi.multithread": True,
        "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.version": (1, 0), **headers,
    }
    answer: dict = {}

    def start_response(status, response_headers, exc_info=None):
        answer["status"] = int(status.split()[0])
        answer["headers"] = {k.lower(): v for k, v in response_headers}

    chunks = application(environ, start_response)
    try:
        content = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    return answer["status"], answer["headers"], content


def test_the_entry_point_dispatches_webhooks_to_their_own_handler():
    assert isinstance(application, DropProcessEnviron) and isinstance(application.app, WebhookDispatch)
    # Loading the webhook stack left the site's middleware setting as it was.
    assert "django.contrib.sessions.middleware.SessionMiddleware" in settings.MIDDLEWARE
    assert set(settings.MIDDLEWARE) >= WEBHOOK_MIDDLEWARE


def test_a_notice_through_the_webhook_stack_is_stored_with_the_security_headers():
    team = make_team("wsgi-team")
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    status, headers, content = call("POST", "/api/v1/webhooks/aws/eventbridge/wsgi-team/", json.dumps(EVENT).encode(),
                                    CONTENT_TYPE="application/json", HTTP_X_API_KEY=key)
    assert status == 202, content
    assert InterruptionNotice.objects.filter(team=team, cloud_event_id="wsgi-ev-1").count() == 1
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware
    assert headers["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware
    assert "set-cookie" not in headers  # no session or CSRF machinery on this path
    status, _, _ = call("POST", "/api/v1/webhooks/aws/eventbridge/wsgi-team/", json.dumps(EVENT).encode(),
                        CONTENT_TYPE="application/json", HTTP_X_API_KEY="wrong")
    assert status == 401


def test_the_rate_limit_still_guards_the_webhooks(monkeypatch):
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WEBHOOKS", "2")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WINDOW_S", "3600")
    # A fresh address: counts live in a store shared across processes and runs (Redis in the
    # PostgreSQL pass), so a fixed one would find an earlier run's requests in the same window.
    environ = {"REMOTE_ADDR": _fresh_ip()}
    statuses = [call("POST", "/api/v1/webhooks/gcp/nobody/", b"{}", CONTENT_TYPE="application/json", **environ)[0]
                for _ in range(3)]
    assert statuses == [401, 401, 429]


def test_other_paths_keep_the_full_stack():
    status, headers, _ = call("GET", "/accounts/login/")
    assert status == 200
    assert "csrftoken" in headers.get("set-cookie", "")  # CSRF middleware ran


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a dead server connection is a PostgreSQL matter; "
                    "SQLite has no server (the suite's PostgreSQL pass runs this)")
@pytest.mark.django_db(transaction=True)
def test_the_insert_skips_the_health_check_and_survives_a_dead_connection():
    """The webhook insert does not ping the database first (CONN_HEALTH_CHECKS would, on every
    request); if the kept-alive connection is dead it reconnects and stores the notice anyway."""
    team = make_team("dead-conn-team")
    draft = NoticeDraft(team_id=team.pk, source="aws_eventbridge", kind="interruption", action="terminate",
                        dedup_key=f"{team.pk}:aws:dead-conn", provider_instance_id="i-dead")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.health_check_done = False  # as at the start of a request
    kept = connection.connection
    kept.close()  # what a server restart leaves behind, as the driver sees it
    with CaptureQueriesContext(connection) as queries:
        result = notices_store(drafts=[draft])
    assert list(result.stored) == [draft.dedup_key]
    assert connection.connection is not kept
    assert not any(q["sql"].strip().upper() == "SELECT 1" for q in queries.captured_queries)
    assert InterruptionNotice.objects.filter(dedup_key=draft.dedup_key).count() == 1
