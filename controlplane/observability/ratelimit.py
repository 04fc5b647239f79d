"""Fixed-window rate limits for the login form and the webhook receivers, keyed by client IP and
route prefix, counted in Django's cache, which settings.py shares between processes (Redis, or files
under SPOTPIPE_VAR_DIR on the embedded default). When the cache cannot be reached (Redis restarting)
requests pass uncounted and a warning is logged: a limiter outage must not become an outage of
notice intake, which the outbox keeps working through a broker outage.

Limits are the SPOTPIPE_RATELIMIT_* tunables (controlplane/tunables.py: requests per client IP per
window; 0 disables a rule). The enrolment key is a bearer secret worth guessing, so enrolment has
a budget of its own; both login forms share one.

The webhook default (100/s sustained per IP) sits far above what any one cloud sends a team, yet a
single load generator benchmarking 1,000 notices/s for a few seconds fits within the window; for
longer benchmarks raise it or set it to 0. Loopback is not exempt by default: behind a reverse proxy
on the same host every client would look like 127.0.0.1 and would then be exempt too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane.tunables import tunable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    name: str
    prefix: str
    methods: frozenset[str] | None  # None: every method
    limit: int


def rules() -> list[Rule]:
    """The rules, read from the environment each time (cheap; lets tests and operators change them)."""
    return [
        Rule("login", "/accounts/login/", frozenset({"POST"}), tunable("SPOTPIPE_RATELIMIT_LOGIN")),
        # The admin site's own login form: the same password guesses, so the same budget (name).
        Rule("login", "/admin/login/", frozenset({"POST"}), tunable("SPOTPIPE_RATELIMIT_LOGIN")),
        Rule("enroll", "/api/v1/agents/enroll/", frozenset({"POST"}), tunable("SPOTPIPE_RATELIMIT_ENROLL")),
        Rule("webhooks", "/api/v1/webhooks/", None, tunable("SPOTPIPE_RATELIMIT_WEBHOOKS")),
    ]


def window_s() -> int:
    return max(int(tunable("SPOTPIPE_RATELIMIT_WINDOW_S")), 1)


def client_ip(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is client-controlled unless a trusted proxy rewrites it, and
    # a limiter keyed on a spoofable header limits nothing.
    return request.META.get("REMOTE_ADDR") or "unknown"


def _exempt(ip: str) -> bool:
    if not tunable("SPOTPIPE_RATELIMIT_EXEMPT_LOOPBACK"):
        return False
    return ip in {"127.0.0.1", "::1"}


class RateLimitMiddleware:
    """Answers 429 with Retry-After once a client exceeds a rule's limit in the current window."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = self._check(request)
        return refused if refused is not None else self.get_response(request)

    def _check(self, request: HttpRequest) -> HttpResponse | None:
        ip = client_ip(request)
        if _exempt(ip):
            return None
        for rule in rules():
            if rule.limit <= 0 or not request.path.startswith(rule.prefix):
                continue
            if rule.methods is not None and request.method not in rule.methods:
                continue
            window = window_s()
            count = _count(f"ratelimit:{rule.name}:{ip}:{int(time.time() // window)}", window)
            if count is None:
                continue
            if count > rule.limit:
                retry_after = window - int(time.time()) % window
                response = JsonResponse(
                    {"detail": f"rate limit exceeded: at most {rule.limit} requests per {window}s to {rule.prefix}"},
                    status=429,
                )
                response["Retry-After"] = str(max(retry_after, 1))
                return response
        return None


def _count(key: str, window: int) -> int | None:
    """This request's number in its window (add() then incr(): atomic in Redis); None when the
    cache cannot be reached."""
    try:
        cache.add(key, 0, timeout=window + 1)
        try:
            return cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=window + 1)
            return 1
    except Exception as exc:  # the cache's server is down: count nothing rather than refuse everything
        log.warning("rate limit not counted: cache unreachable (%s)", type(exc).__name__)
        return None
