"""The heartbeat fast path of the ASGI entry point (`controlplane/asgi.py`).

An agent's plain heartbeat (`POST /api/v1/instances/{id}/heartbeat/`, body empty, `{}` or the
address the instance already has, its own agent token) is answered without Django's request
handling: the ASGI layer reads the request (`heartbeat_claim`), hashes the token's key at once and
drops it, and parks the claim in this worker's `common.window_batches.WindowBatches`. Every `window_s` (tunable
`SPOTPIPE_HEARTBEAT_BATCH_S`, 0.1 s) the claims of the window go to the pool together:
`fleet.heartbeats.instance_heartbeats_record_batch` reads their tokens, instances and jobs in one
query, stamps `last_heartbeat_at` of all of them in ONE conditional UPDATE, and only then are the
heartbeats answered, with the view's body and headers. So:
- an acknowledged heartbeat is already written (nothing to lose at a shutdown, clean or not), and
  its stamp is at most one window (plus the write) later than the view's would be: far inside the
  dead-node timeout (`SPOTPIPE_HEARTBEAT_TIMEOUT_S`, 2 s by default);
- the token is checked against the database in every batch, as the view does per request: a
  revoked or expired token is never accepted after its revocation committed (no cache to expire);
- everything else goes to the view, which stays the one owner of the rules and of every refusal:
  another method, path, query string, Accept or Content-Type, a cookie, a body other than the
  three plain ones, a new address, an unknown, revoked or expired token, a user token, another
  instance's token, an ended instance, a host Django refuses, an http request Django would redirect
  to https, a failed batch, and more than one heartbeat per instance per `MIN_INTERVAL_S` in this
  worker (the API throttle, per principal, only counts what reaches the view).
docs/orchestration.md, "The heartbeat fast path", has the measured cost."""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import DisallowedHost, PermissionDenied
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import resolve, reverse

from controlplane.accounts.authentication import hash_key
from controlplane.fleet.heartbeats import HeartbeatClaim, instance_heartbeats_record_batch
from controlplane.hotpaths.wsgi_bridge import WSGIResponse, wsgi_environ

# One instance's heartbeats take the fast path at most once in this time (agents send one every 0.5
# to 10 s); more go to the view and its throttle.
MIN_INTERVAL_S = 0.1
# A body longer than this is not a plain heartbeat.
MAX_BODY = 1024
_PLACEHOLDER = "4242424242"
_URL = reverse("instance-heartbeat", kwargs={"pk": _PLACEHOLDER})
PATH = re.compile(re.escape(_URL).replace(_PLACEHOLDER, "([1-9][0-9]{0,17})"))
_JSON = {b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8"}
_ACCEPT = {b"*/*", b"application/json"}
_KEYWORDS = {b"token", b"bearer"}  # ApiTokenAuthentication's


def heartbeat_instance(scope: dict[str, Any]) -> int | None:
    """The instance id when `scope` is a heartbeat POST the fast path may take, else None."""
    if scope.get("method") != "POST" or scope.get("root_path") or scope.get("query_string"):
        return None
    match = PATH.fullmatch(scope.get("path", ""))
    return int(match.group(1)) if match else None


def agent_headers(scope: dict[str, Any]) -> tuple[dict[bytes, bytes], str] | None:
    """The headers of a plain agent request (no cookie, Accept JSON or anything, one `Token` or
    `Bearer` key, none of authorization, content-type, accept and host twice) and its token's key;
    None for anything the view must answer. Also the command poll's (hotpaths/poll_channel.py)."""
    seen: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name in seen and name in (b"authorization", b"content-type", b"accept", b"host"):
            return None
        seen[name] = value
    if b"cookie" in seen or seen.get(b"accept", b"*/*").strip().lower() not in _ACCEPT:
        return None
    parts = seen.get(b"authorization", b"").split()
    if len(parts) != 2 or parts[0].lower() not in _KEYWORDS:
        return None
    try:
        return seen, parts[1].decode()
    except UnicodeDecodeError:
        return None


def checked_request(scope: dict[str, Any], body: bytes) -> WSGIRequest | None:
    """The request, when Django's middlewares let it through to a view (ALLOWED_HOSTS,
    DISALLOWED_USER_AGENTS, PREPEND_WWW, SECURE_SSL_REDIRECT); None: their answer is the view's."""
    request = WSGIRequest(wsgi_environ(scope, io.BytesIO(body)))
    _, common, security = _middlewares()
    try:
        if common.process_request(request) is not None or security.process_request(request) is not None:
            return None
    except (DisallowedHost, PermissionDenied):
        return None
    return request


def heartbeat_claim(scope: dict[str, Any], body: bytes, instance_id: int) -> tuple[HeartbeatClaim, WSGIRequest] | None:
    """The claim of a plain heartbeat, with a request Django checked the host and scheme of; None
    for anything the view must answer."""
    plain = agent_headers(scope)
    if plain is None:
        return None
    seen, key = plain
    address = ""
    if body:
        if len(body) > MAX_BODY or seen.get(b"content-type", b"").strip().lower() not in _JSON:
            return None
        try:
            data = json.loads(body.decode("utf-8"))
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or not set(data) <= {"agent_address"}:
            return None
        address = data.get("agent_address", "")
        if not isinstance(address, str):  # a string other than the instance's address: the batch hands it over
            return None
    request = checked_request(scope, body)
    if request is None:
        return None
    return HeartbeatClaim(key_hash=hash_key(key), instance_id=instance_id, agent_address=address), request


@functools.cache
def _middlewares() -> tuple[XFrameOptionsMiddleware, CommonMiddleware, SecurityMiddleware]:
    """The middlewares whose response headers the view's answer carries, in the order they add them
    (they read their settings once: `cache_clear()` after changing them)."""
    return tuple(m(lambda request: None) for m in (XFrameOptionsMiddleware, CommonMiddleware, SecurityMiddleware))


@functools.cache
def view_headers(url: str = _URL) -> dict[str, str]:
    """The headers DRF gives the answer of the view at `url` (`APIView.default_response_headers`):
    its methods, and `Vary: Accept` when it has more than one renderer (development's browsable API)."""
    match = resolve(url)
    view, actions = match.func.cls, getattr(match.func, "actions", None)
    if actions is None:  # a plain APIView: Django's View.setup() answers HEAD with get
        allowed = [m.upper() for m in view.http_method_names
                   if hasattr(view, m) or (m == "head" and hasattr(view, "get"))]
    else:
        allowed = [m.upper() for m in view.http_method_names if m in actions or (m != "head" and hasattr(view, m))]
    vary = {"Vary": "Accept"} if len(view.renderer_classes) > 1 else {}
    return {**vary, "Allow": ", ".join(allowed)}  # in DRF's order (`APIView.finalize_response`)


def render_results(results: Sequence[dict[str, Any] | None]) -> list[bytes | None]:
    """The view's JSON body for each result (None stays None)."""
    from rest_framework.renderers import JSONRenderer

    from controlplane.fleet.api.serializers import HeartbeatResultSerializer

    renderer = JSONRenderer()
    # One serializer for the batch (a serializer's fields are copied per instance: most of its cost).
    data = iter(HeartbeatResultSerializer([r for r in results if r is not None], many=True).data)
    return [None if r is None else renderer.render(next(data)) for r in results]


def record_and_render(claims: Sequence[HeartbeatClaim]) -> list[bytes | None]:
    """The batch's write and its answers' bodies (in a pool thread)."""
    return render_results(instance_heartbeats_record_batch(claims))


def response(request: WSGIRequest, body: bytes, url: str = _URL) -> WSGIResponse:
    """The 200 of the view at `url` for `body`: DRF's headers, then the middlewares' (frame
    options, length, security headers, HSTS on https), as they add them to the view's answer."""
    answer = HttpResponse(body, content_type="application/json")
    for name, value in view_headers(url).items():
        answer[name] = value
    for middleware in _middlewares():
        answer = middleware.process_response(request, answer)
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.items()]
    return WSGIResponse(200, headers, body)
