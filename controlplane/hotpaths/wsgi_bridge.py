"""Run a WSGI application from an ASGI server, in a pool of threads of its own.

The control plane is a WSGI application (Django + DRF views, the webhook fast path); only the
agents' command long-poll is served asynchronously (`controlplane/asgi.py`). Why not Django's own
ASGI handler for the rest: it runs sync views and middleware thread-sensitively, in ONE thread per
process, which would serialise every webhook and dashboard request of a worker. Here each request
takes one of `threads` threads for its view, as granian's WSGI interface did with its blocking
threads, and a held long-poll takes none. The request body is read first (spooled to disk past
1 MiB, as Django's ASGI handler does), so a view that refuses a request without reading its body
(a 401, a 403) still leaves a kept-alive connection ready for the next request. A body over the
server's ceiling (`max_body_bytes`: larger than any route accepts) is not read: it is answered
413 at once, from its declared length or as soon as it passes the ceiling, with
`Connection: close`. A streaming response (file downloads) is sent chunk by chunk, each chunk
read in the pool."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from controlplane.hotpaths.thread_pools import DatabaseThreadPool

SPOOL_BYTES = 1024 * 1024


@dataclass
class WSGIResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    # Set for a streaming response: the rest of its body, read chunk by chunk in the pool.
    rest: Any = None


class BodyTooLarge(Exception):
    """A request body over the server's ceiling (declared or read so far)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body is over this server's {limit}-byte limit")
        self.limit = limit


def too_large_response(limit: int) -> WSGIResponse:
    """413 in the API's error shape, closing the connection (the rest of the body is not read)."""
    body = json.dumps({"detail": str(BodyTooLarge(limit)), "errors": {"body": [str(BodyTooLarge(limit))]}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    return WSGIResponse(413, headers, body)


def declared_length(scope: dict[str, Any]) -> int | None:
    """The request's Content-Length, when it has one that parses."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


async def read_body(receive: Callable, *, limit: int | None = None,
                    declared: int | None = None) -> tempfile.SpooledTemporaryFile:
    """The whole request body, spooled; `BodyTooLarge` past `limit` bytes (declared or read)."""
    if limit is not None and declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    body = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+b")  # noqa: SIM115 - the caller closes it
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            body.close()
            raise BodyTooLarge(limit)
        body.write(chunk)
        if not message.get("more_body", False):
            break
    body.seek(0)
    return body


def wsgi_environ(scope: dict[str, Any], body: Any) -> dict[str, Any]:
    """PEP 3333's environ for an ASGI HTTP `scope` (PATH_INFO as latin-1 of its UTF-8 bytes)."""
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client") or ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": scope.get("root_path", "").encode("utf-8").decode("latin-1"),
        "PATH_INFO": scope["path"].encode("utf-8").decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] if server[1] is not None else 80),
        "REMOTE_ADDR": str(client[0]),
        "REMOTE_PORT": str(client[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        if name == "CONTENT_TYPE" or name == "CONTENT_LENGTH":
            environ[name] = value
            continue
        key = f"HTTP_{name}"
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    if "CONTENT_LENGTH" not in environ:  # a chunked request: the body was read whole, say its size
        environ["CONTENT_LENGTH"] = str(body.seek(0, 2))
        body.seek(0)
    return environ


def _close(result: Iterable[bytes]) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


def call_wsgi(app: Callable, environ: dict[str, Any]) -> WSGIResponse:
    """Run `app` for `environ` in this thread; the whole body unless the response streams."""
    started: dict[str, Any] = {}
    written: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
        started["status"] = int(status.split(" ", 1)[0])
        started["headers"] = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return written.append

    result = app(environ, start_response)
    if getattr(result, "streaming", False):
        iterator = iter(result)
        first = next(iterator, b"")
        return WSGIResponse(started["status"], started["headers"], b"".join(written) + first, rest=(result, iterator))
    try:
        body = b"".join(written) + b"".join(result)
    finally:
        _close(result)  # Django's request_finished: closes this thread's expired DB connections
    return WSGIResponse(started["status"], started["headers"], body)


def _next_chunk(iterator: Any) -> bytes | None:
    return next(iterator, None)


class WSGIBridge:
    """ASGI application that serves `app` (WSGI) with `threads` threads."""

    def __init__(self, app: Callable, *, threads: int, max_body_bytes: int | None = None) -> None:
        self.app = app
        self.threads = threads
        self.max_body_bytes = max_body_bytes
        self.executor = DatabaseThreadPool(max_workers=threads, thread_name_prefix="wsgi")

    async def call(self, scope: dict[str, Any], body: Any, *, extra: dict[str, Any] | None = None,
                   executor: Any = None) -> WSGIResponse:
        """The whole response of the application for `scope` (plus `extra` environ keys), run in
        `executor` (default: this bridge's threads)."""
        environ = {**wsgi_environ(scope, body), **(extra or {})}
        return await asyncio.get_running_loop().run_in_executor(executor or self.executor, call_wsgi, self.app,
                                                                environ)

    async def receive_body(self, scope: dict[str, Any], receive: Callable, send: Callable) -> Any:
        """The request's body, or None when it was over the ceiling (then 413 is already sent)."""
        try:
            return await read_body(receive, limit=self.max_body_bytes, declared=declared_length(scope))
        except BodyTooLarge as exc:
            await send_response(send, too_large_response(exc.limit))
            return None

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        body = await self.receive_body(scope, receive, send)
        if body is None:
            return
        try:
            response = await self.call(scope, body)
        finally:
            body.close()
        await send_response(send, response, executor=self.executor)


async def send_response(send: Callable, response: WSGIResponse, *, executor: Any = None) -> None:
    """Send `response` (streaming the rest of its body in `executor` if it has one)."""
    await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
    if response.rest is None:
        await send({"type": "http.response.body", "body": response.body, "more_body": False})
        return
    result, iterator = response.rest
    loop = asyncio.get_running_loop()
    try:
        await send({"type": "http.response.body", "body": response.body, "more_body": True})
        while (chunk := await loop.run_in_executor(executor, _next_chunk, iterator)) is not None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await loop.run_in_executor(executor, _close, result)
