"""One HTTP request through an ASGI application, for the tests of the ASGI entry point's fast
paths (heartbeats, command polls) and of the agent channel: the scope a server would build, and a
client that stays connected until it has its whole answer (a disconnect would end a held poll);
and the SQL each batch of a fast path runs. `asgi_control_plane` builds the application for one test;
tests/orchestration/conftest.py shuts its thread pools down after the test, which closes their
threads' database connections (else each app left PostgreSQL sessions open until the end)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

_BUILT: list[Any] = []


def asgi_control_plane(wsgi: Callable | None = None, **kwargs: Any) -> Any:
    """`controlplane.asgi.ControlPlane(wsgi, **kwargs)` (default: the project's WSGI application),
    its pools shut down after the test (`close_control_planes`)."""
    from controlplane.asgi import ControlPlane
    from controlplane.wsgi import application

    app = ControlPlane(wsgi or application, **kwargs)
    _BUILT.append(app)
    return app


def close_control_planes() -> None:
    """Shut down the pools of every application `asgi_control_plane` built."""
    while _BUILT:
        _BUILT.pop().close_pools()


def http_scope(*, method: str, path: str, headers: dict[str, str] | None = None, query: str = "") -> dict[str, Any]:
    """The ASGI scope of a plain HTTP/1.1 request from 127.0.0.1 (header names lower-cased)."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}


async def asgi_request(app: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, dict, bytes]:
    """Send one request (`body` in one message) and return (status, headers, body) of the answer."""
    sent: list[dict] = []
    answered = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    await app(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def capturing_sql(fn: Callable[[Any], Any]) -> tuple[Callable[[Any], Any], list[list[str]]]:
    """`fn` (a fast path's batch step, called with the window's claims) wrapped to record the SQL
    of each call: returns (the wrapper, the list it appends each call's statements to)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    statements: list[list[str]] = []

    def capturing(claims: Any) -> Any:
        with CaptureQueriesContext(connection) as queries:
            result = fn(claims)
        statements.append([q["sql"] for q in queries.captured_queries])
        return result

    return capturing, statements
