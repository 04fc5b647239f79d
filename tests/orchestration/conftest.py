"""Fixtures of the orchestration tests: a moto EC2 server, local node roots, and the orphan check."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from controlplane.orchestration.providers.local import LocalProvider


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


@pytest.fixture
def ec2(moto_server, monkeypatch):
    """A boto3 EC2 client bound to the moto server, with fake credentials, and its request log."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    log = RequestLog()
    client.meta.events.register("before-send.ec2.*", log)
    client.request_log = log
    return client


@pytest.fixture
def local_provider(tmp_path: Path):
    """A local provider under a temporary root; every node it started is gone after the test."""
    provider = LocalProvider(tmp_path / "nodes", start_timeout_s=20)
    yield provider
    provider.terminate(provider.all_node_ids())
    assert provider.live_pids() == [], "local nodes left processes behind"
