"""Fixtures of the orchestration tests: a moto EC2 server, local node roots, and the orphan check."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from controlplane.orchestration.providers.local.provider import LocalProvider


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll `predicate` every 20 ms until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server():
    """moto in server mode on a free 127.0.0.1 port (the provider talks to it over HTTP through
    `endpoint_url`, exactly as to EC2)."""
    import os

    from moto.server import ThreadedMotoServer

    # Loading moto's default AMI catalogue costs seconds and the tests use their own image id.
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


class RequestLog:
    """The EC2 Query requests a client sent, decoded (Action=..., nested keys flattened)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, list[str]]] = []

    def __call__(self, request, **kwargs) -> None:
        body = request.body
        if isinstance(body, bytes):
            body = body.decode()
        self.requests.append(parse_qs(body or ""))

    def by_action(self, action: str) -> list[dict[str, str]]:
        return [{k: v[0] for k, v in r.items()} for r in self.requests if r.get("Action") == [action]]


def _ec2_client(endpoint: str, region: str):
    """A boto3 EC2 client of `region` on the moto server, with its request log (moto's server
    serves every region from one endpoint and takes the region from the request's signature)."""
    import boto3

    client = boto3.client("ec2", region_name=region, endpoint_url=endpoint,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    log = RequestLog()
    client.meta.events.register("before-send.ec2.*", log)
    client.request_log = log
    return client


@pytest.fixture
def ec2(moto_server, monkeypatch):
    """A boto3 EC2 client bound to the moto server in us-east-1, with fake credentials, and its
    request log."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return _ec2_client(moto_server, "us-east-1")


@pytest.fixture
def ec2_regions(ec2, moto_server):
    """`ec2_regions(region)`: the moto client of a region, one per region for the test (us-east-1's
    is `ec2`); a provider's `client_factory`."""
    clients = {"us-east-1": ec2}

    def client_of(region: str):
        if region not in clients:
            clients[region] = _ec2_client(moto_server, region)
        return clients[region]

    return client_of


@pytest.fixture
def local_provider(tmp_path: Path):
    """A local provider under a temporary root; every node it started is gone after the test."""
    provider = LocalProvider(tmp_path / "nodes", start_timeout_s=20)
    yield provider
    provider.terminate(provider.all_node_ids())
    assert provider.live_pids() == [], "local nodes left processes behind"


@pytest.fixture(autouse=True)
def _no_rendezvous_store(monkeypatch):
    """Service and agent tests run without the per-job TCPStore process (the end-to-end test turns
    it back on)."""
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "none")


@pytest.fixture(autouse=True)
def _artifact_store(tmp_path, settings):
    """Each test's jobs export their weights under its own folder: job ids restart with every test
    database, so a shared store would mix one run's files with an older run's of the same id."""
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")


@pytest.fixture(scope="session")
def orchestration_worker(django_db_setup, django_db_blocker):
    """One real Celery worker thread for the session, on a queue no other process consumes (the
    broker may be shared with a running control plane). Routing is switched once per session:
    Celery caches its router, so switching per test would send tasks to a stale queue."""
    import uuid

    from celery.contrib.testing.worker import start_worker

    from controlplane.celery import app

    queue = f"orchestration-test-{uuid.uuid4().hex[:8]}"
    previous = app.conf.task_default_queue, app.conf.task_routes

    def reset_routing() -> None:
        app.amqp.flush_routes()
        for cached in ("queues", "router", "default_queue"):
            app.amqp.__dict__.pop(cached, None)

    from celery.signals import task_postrun
    from django.db import connection

    def close_connection(**kwargs) -> None:
        # The worker thread must not keep a connection across a test's flush, nor at the end.
        connection.close()

    app.conf.task_default_queue = queue
    app.conf.task_routes = {"*": {"queue": queue}}
    reset_routing()
    task_postrun.connect(close_connection, weak=False)
    try:
        with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False, queues=[queue],
                          shutdown_timeout=10, loglevel="WARNING") as worker:
            worker.test_queue = queue
            yield worker
    finally:
        task_postrun.disconnect(close_connection)
        app.conf.task_default_queue, app.conf.task_routes = previous
        reset_routing()


def quiesce_worker(worker, timeout: float = 20.0) -> None:
    """Drop queued tasks and wait until the worker runs none, so that a transactional test's
    database flush does not race a task still writing."""
    import time

    from celery.worker import state
    from kombu import Queue

    from controlplane.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with app.connection_for_write() as conn:
            Queue(worker.test_queue, channel=conn.default_channel).purge()
        if not state.active_requests and not state.reserved_requests:
            time.sleep(0.3)  # a task published a moment ago may still be in flight
            if not state.active_requests and not state.reserved_requests:
                return
        time.sleep(0.1)


class ControlPlaneServer:
    """The control plane's WSGI app on a free port, served by threads that each open their own
    database connection. (pytest-django's `live_server` shares the test's single SQLite connection
    with every request thread, which breaks under many concurrent agents.)

    A request thread closes its database connection when its client connection ends (Django's
    `ThreadedWSGIServer.close_request`); one whose client keeps the connection alive waits for the
    next request holding it. `stop` ends those client connections and waits for their threads, so
    no PostgreSQL session outlives the test (the test database could not be dropped)."""

    STOP_WAIT_S = 5.0

    def __init__(self) -> None:
        import threading

        from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
        from django.core.wsgi import get_wsgi_application

        class QuietHandler(WSGIRequestHandler):
            def log_message(self, *args) -> None:
                return

        class TrackingServer(ThreadedWSGIServer):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                self.open_requests: dict = {}  # client socket -> its request thread
                self.lock = threading.Lock()

            def process_request_thread(self, request, client_address) -> None:
                with self.lock:
                    self.open_requests[request] = threading.current_thread()
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    with self.lock:
                        self.open_requests.pop(request, None)

        self.httpd = TrackingServer(("127.0.0.1", 0), QuietHandler, allow_reuse_address=False)
        self.httpd.set_app(get_wsgi_application())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="control-plane", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        import contextlib
        import socket
        import time

        self.httpd.shutdown()
        with self.httpd.lock:
            open_requests = dict(self.httpd.open_requests)
        for sock in open_requests:  # a kept-alive client's next read ends: its thread closes and exits
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + self.STOP_WAIT_S
        for thread in open_requests.values():  # a request still running (a held poll) gets a bound
            thread.join(max(0.0, deadline - time.monotonic()))
        self.httpd.server_close()


@pytest.fixture
def control_plane(transactional_db):
    server = ControlPlaneServer()
    yield server
    server.stop()


def _marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (every process these tests start
    inherits it: nodes, agents, workers, rendezvous stores)."""
    import os

    needle = f"SPOTPIPE_TEST_SESSION={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


@pytest.fixture(scope="session")
def _session_marker():
    """After the whole orchestration test set, no process it started is still alive."""
    import time
    import uuid

    marker = uuid.uuid4().hex
    yield marker
    deadline = time.monotonic() + 5
    while _marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _marked_pids(marker)
    assert left == [], f"processes left behind by the orchestration tests: {left}"


@pytest.fixture(autouse=True)
def _mark_children(_session_marker, monkeypatch):
    """Every process a test of this directory starts inherits the session's marker (and only
    those: other test directories' processes are not counted)."""
    monkeypatch.setenv("SPOTPIPE_TEST_SESSION", _session_marker)
    # Local nodes get only the variables named for them (providers/local/environment.py).
    monkeypatch.setenv("SPOTPIPE_LOCAL_NODE_ENV", "SPOTPIPE_TEST_SESSION")


@pytest.fixture
def fake():
    """A FakeProvider registered as the `local` provider for the test, unregistered after."""
    from controlplane.orchestration.providers import set_provider
    from tests.orchestration.fakes import FakeProvider

    provider = FakeProvider()
    set_provider("local", provider)
    yield provider
    set_provider("local", None)


@pytest.fixture(autouse=True)
def _control_planes_closed():
    """The ASGI applications a test built with `asgi_client.asgi_control_plane`, shut down after it."""
    yield
    from tests.orchestration.asgi_client import close_control_planes

    close_control_planes()
