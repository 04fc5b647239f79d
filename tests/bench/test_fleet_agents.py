"""The fleet bench's simulated agents send what real agents send: their command polls are plain
polls that the batched fast path takes (`poll_channel.poll_claim`), as a real agent's (requests, a
GET with no body) are. Until 2026-11-27 they sent `Content-Type` on every poll, so each one went
through the DRF view instead, and the bench measured a slower path than real agents take."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
import requests

from bench._fleet_agents import COMMANDS_PATH, POLL_WAIT_S, Fleet
from controlplane.hotpaths.poll_channel import poll_claim
from tests.orchestration.asgi_client import http_scope


def _scope_of(head: bytes) -> dict:
    """The ASGI scope granian would build for this raw request head."""
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ")
    path, _, query = target.partition("?")
    headers = dict(line.split(": ", 1) for line in lines if line)
    return http_scope(method=method, path=path, headers=headers, query=query)


async def _first_poll_head() -> bytes:
    """The head of the first command poll a simulated agent sends (to a server that answers {})."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head[:-4])
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{"version": "v1"}')
        await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fleet = Fleet(port, [(7, 1, "k" * 40)], heartbeat_s=3600.0)  # the heartbeat comes much later
    fleet.start()
    try:
        while not heads:
            await asyncio.sleep(0.01)
    finally:
        await fleet.stop()
        server.close()
    return heads[0]


@pytest.mark.django_db
def test_a_simulated_poll_takes_the_fast_path_like_a_real_agents() -> None:
    head = asyncio.run(_first_poll_head())
    assert head.startswith(f"GET {COMMANDS_PATH}?version=&wait={POLL_WAIT_S} ".encode()), head
    assert poll_claim(_scope_of(head), b"") is not None, head

    # The real agent (agent/client.py: a requests Session, params, the token header, no body).
    prepared = requests.Session().prepare_request(requests.Request(
        "GET", f"http://127.0.0.1:8000/api/v1/{COMMANDS_PATH.removeprefix('/api/v1/')}",
        params={"version": "", "wait": 20.0}, headers={"Authorization": "Token " + "k" * 40}))
    url = urlsplit(prepared.url)
    real = http_scope(method="GET", path=url.path, headers=dict(prepared.headers), query=url.query)
    assert poll_claim(real, b"") is not None

    # A poll with a Content-Type is the view's (the rule the simulated agents used to break).
    with_type = _scope_of(head + b"\r\nContent-Type: application/json")
    assert poll_claim(with_type, b"") is None
