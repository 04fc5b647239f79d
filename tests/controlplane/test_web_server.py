"""The product's web server (granian, started exactly as `spotpipe.demo.processes.granian_args` and
docker-compose start it) in front of the control plane: a real process on loopback, the test's
database, real HTTP. What only a real server shows: the notice is stored and answered, a replay
is answered without a second row, an oversized body is refused by the view, every refusal on a
kept-alive connection is answered and the connection goes on, a body past the server's ceiling is
refused unread, the server's own environment variables never reach a request, and an agent's
heartbeat is answered (and refused once its token is revoked)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

from controlplane.fleet.models import InterruptionNotice
from controlplane.hotpaths.wsgi_environ import DropProcessEnviron, process_only_keys
from spotpipe.demo.processes import granian_args, web_threads_env
from tests.controlplane.factories import make_team, make_webhook_credential

REPO_ROOT = Path(__file__).resolve().parents[2]
TEAM = "server-team"


def _database_url() -> str:
    """The URL of the database this test runs on (pytest-django's test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    user = s.get("USER") or "postgres"
    return f"postgres://{user}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "SPOTPIPE_NOTICE_HANDOFF": "none",  # no broker needed: the stored rows are what is checked
        "SPOTPIPE_VAR_DIR": str(tmp_path),
        **web_threads_env(4),
    }
    log = (tmp_path / "web.log").open("wb")
    proc = subprocess.Popen([sys.executable, *granian_args(host="127.0.0.1", port=port, workers=1)],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "web.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{base}/api/v1/webhooks/aws/eventbridge/{TEAM}/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # 405 for a GET: the server and Django answer
            except OSError:
                assert time.monotonic() < deadline, "granian did not answer within 60 s"
                time.sleep(0.2)
        yield base
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


EVENT = {
    "version": "0", "id": "server-ev-1", "source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning",
    "account": "123456789012", "time": "2026-11-20T14:02:00Z", "region": "us-east-1", "resources": [],
    "detail": {"instance-id": "i-0aaaabbbbccccdddd", "instance-action": "terminate"},
}


@pytest.mark.django_db(transaction=True)
def test_granian_serves_the_webhooks_stores_once_and_refuses_an_oversized_body(server):
    team = make_team(TEAM)
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    url = f"{server}/api/v1/webhooks/aws/eventbridge/{TEAM}/"
    headers = {"Content-Type": "application/json", "x-api-key": key}

    status, body = _post(url, json.dumps(EVENT).encode(), headers)
    assert status == 202, body
    replay_status, _ = _post(url, json.dumps(EVENT).encode(), headers)
    assert replay_status == 200
    rows = InterruptionNotice.objects.values_list("cloud_event_id", "provider_instance_id", "status")
    assert list(rows) == [("server-ev-1", "i-0aaaabbbbccccdddd", "received")]

    big = json.dumps({**EVENT, "id": "server-ev-big", "pad": "x" * (1024 * 1024)}).encode()
    # The server reads the whole body (it is under the server's ceiling) before the view refuses
    # it, so the client always gets the answer rather than a reset connection.
    status, body = _post(url, big, headers)
    assert status == 413 and "1048576-byte limit" in body["detail"]
    bad_key_status, body = _post(url, json.dumps({**EVENT, "id": "server-ev-2"}).encode(),
                                 {**headers, "x-api-key": "wrong"})
    assert bad_key_status == 401, body
    assert InterruptionNotice.objects.count() == 1


def test_the_process_environment_is_dropped_from_every_request():
    seen: dict = {}

    def inner(environ, start_response):
        seen.update(environ)
        return [b""]

    app = DropProcessEnviron(inner, env=["DATABASE_URL", "SECRET_KEY", "HTTP_PROXY", "SERVER_NAME", "PATH"])
    app({"DATABASE_URL": "postgres://secret", "SECRET_KEY": "k", "PATH": "/usr/bin", "PATH_INFO": "/x",
         "HTTP_PROXY": "from-a-header", "SERVER_NAME": "host", "REQUEST_METHOD": "GET", "wsgi.input": None},
        lambda *a: None)
    assert set(seen) == {"PATH_INFO", "HTTP_PROXY", "SERVER_NAME", "REQUEST_METHOD", "wsgi.input"}
    # A request's own keys are never dropped, whatever the process environment holds.
    assert process_only_keys(["HTTP_X", "wsgi.errors", "CONTENT_TYPE", "REMOTE_ADDR", "HOME"]) == {"HOME"}


def _exchange(conn, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    return response.status, response.getheader("connection") or "", response.read()


@pytest.mark.django_db(transaction=True)
def test_every_refusal_on_a_kept_alive_connection_is_answered_and_the_connection_goes_on(server):
    """Issue 21, "every request gets an answer": requests refused before the view reads their body
    (no token, a wrong webhook key, a PATCH without permission, an unknown route, a method the
    route lacks, the webhook's own 1 MiB limit) each get their answer on ONE kept-alive
    connection, and the next request on it is answered too (the server read each body)."""
    import http.client

    team = make_team(TEAM)
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    webhook = f"/api/v1/webhooks/aws/eventbridge/{TEAM}/"
    json_headers = {"Content-Type": "application/json"}
    refusals = [
        ("PATCH", "/api/v1/jobs/1/", json.dumps({"name": "x" * 50_000}).encode(), json_headers, 401),
        ("PATCH", "/api/v1/jobs/1/", b"{}", {**json_headers, "Authorization": "Token sp_not-a-key"}, 401),
        ("POST", webhook, json.dumps({**EVENT, "pad": "y" * 200_000}).encode(),
         {**json_headers, "x-api-key": "wrong"}, 401),
        ("POST", webhook, json.dumps({**EVENT, "pad": "z" * (1024 * 1024)}).encode(),
         {**json_headers, "x-api-key": key}, 413),
        ("POST", "/api/v1/no-such-route/", b"x" * 100_000, {"Content-Type": "text/plain"}, 404),
        ("DELETE", webhook, b"x" * 10_000, {"Content-Type": "text/plain"}, 405),
    ]
    host, port = server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        for method, path, body, headers, expected in refusals:
            status, connection_header, answer = _exchange(conn, method, path, body, headers)
            assert status == expected, (method, path, answer[:300])
            assert "close" not in connection_header.lower(), (method, path)
        status, _, answer = _exchange(conn, "POST", webhook, json.dumps(EVENT).encode(),
                                      {**json_headers, "x-api-key": key})
        assert status == 202, answer  # the same connection still serves
    finally:
        conn.close()
    assert InterruptionNotice.objects.count() == 1


def test_a_body_over_the_servers_ceiling_is_answered_413_without_being_read(server):
    """A declared length past every route's limit (`request_body_ceiling`) is answered at once with
    413 and `Connection: close`; the server does not wait for (or spool) the body."""
    from controlplane.hotpaths.request_limits import request_body_ceiling

    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        declared = request_body_ceiling() + 1
        sock.sendall(f"POST /api/v1/spot-prices/upload/ HTTP/1.1\r\nHost: {host}\r\n"
                     f"Content-Type: application/octet-stream\r\nContent-Length: {declared}\r\n\r\n".encode()
                     + b"x" * 1000)
        started = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["errors"]["body"] == [f"body is over this server's {declared - 1}-byte limit"]
    assert time.monotonic() - started < 5


def test_a_chunked_body_is_cut_off_once_it_passes_the_ceiling():
    """No Content-Length (chunked): the bridge counts what it reads and stops past the limit."""
    import asyncio

    from controlplane.hotpaths.wsgi_bridge import BodyTooLarge, read_body

    def receiver(chunks):
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                    for i, c in enumerate(chunks)]

        async def receive():
            return messages.pop(0)
        return receive

    body = asyncio.run(read_body(receiver([b"a" * 600, b"b" * 400]), limit=1000))
    assert body.read() == b"a" * 600 + b"b" * 400
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_body(receiver([b"a" * 600, b"b" * 401, b"never read"]), limit=1000))
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_body(receiver([b""]), limit=1000, declared=1001))


@pytest.mark.django_db(transaction=True)
def test_granian_answers_an_agents_heartbeat_and_refuses_it_once_its_token_is_revoked(server):
    """Through the real server the plain heartbeat takes the ASGI fast path
    (controlplane/hotpaths/heartbeat_channel.py): answered 200 with its stamp written; the same
    token revoked is refused at the next heartbeat."""
    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.services import api_token_revoke
    from controlplane.fleet.models import Instance
    from controlplane.fleet.services import instance_transition
    from tests.controlplane.api_helpers import make_api_token
    from tests.controlplane.factories import make_instance, make_job

    team = make_team(TEAM)
    instance = make_instance(team, job=make_job(team))
    instance_transition(instance=instance, to="running")
    key = make_api_token(team, instance=instance)
    url = f"{server}/api/v1/instances/{instance.pk}/heartbeat/"
    headers = {"Content-Type": "application/json", "Authorization": f"Token {key}"}

    status, body = _post(url, b"{}", headers)
    assert status == 200, body
    assert body["instance"] == instance.pk and body["state"] == "running"
    stamp = Instance.objects.get(pk=instance.pk).last_heartbeat_at
    assert stamp is not None and stamp.isoformat().replace("+00:00", "Z") == body["last_heartbeat_at"]

    api_token_revoke(token=ApiToken.objects.get(instance=instance, revoked_at__isnull=True))
    status, body = _post(url, b"{}", headers)
    assert status == 401 and body["detail"] == "invalid, revoked or expired token"
    assert Instance.objects.get(pk=instance.pk).last_heartbeat_at == stamp


def _get(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.django_db(transaction=True)
def test_granian_takes_an_agents_plain_poll_and_refuses_it_once_its_token_is_revoked(server):
    """Through the real server, a plain command poll (the shape whose first step the batched path
    takes, controlplane/hotpaths/poll_channel.py): a stale version answered at once, a current
    one held for its wait (less up to 25%); the same token revoked is refused at the next poll."""
    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.services import api_token_revoke
    from controlplane.fleet.services import instance_transition
    from controlplane.orchestration import services
    from tests.controlplane.api_helpers import make_api_token
    from tests.controlplane.factories import make_instance, make_job

    team = make_team(TEAM)
    instance = make_instance(team, job=make_job(team))
    instance_transition(instance=instance, to="running")
    key = make_api_token(team, instance=instance)
    url = f"{server}/api/v1/agents/commands/"
    headers = {"Authorization": f"Token {key}"}

    started = time.monotonic()
    status, answer = _get(f"{url}?version=&wait=20", headers)
    assert status == 200 and time.monotonic() - started < 5, answer
    expected = services.agent_commands(instance_id=instance.pk)
    assert (answer["instance"], answer["version"], answer["action"]) == (
        instance.pk, expected["version"], expected["action"])
    started = time.monotonic()
    status, held = _get(f"{url}?version={answer['version'].replace(':', '%3A')}&wait=1", headers)
    assert status == 200 and held == answer and time.monotonic() - started >= 0.7

    api_token_revoke(token=ApiToken.objects.get(instance=instance, revoked_at__isnull=True))
    status, body = _get(f"{url}?version=&wait=20", headers)
    assert status == 401 and body["detail"] == "invalid, revoked or expired token"
