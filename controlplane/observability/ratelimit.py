"""Rate limits for the login forms, agent enrolment and the webhook receivers, per client IP.

Counting is django-ratelimit's (`django_ratelimit.core.get_usage`: fixed windows of
SPOTPIPE_RATELIMIT_WINDOW_S seconds, each key's window edge offset by a hash of the key, counted with
cache.add() then cache.incr()) in Django's default cache, which settings.py shares between processes
(Redis, or files under SPOTPIPE_VAR_DIR on the embedded default). This module only says which
requests each rule covers and what a refusal looks like; it runs as a middleware, before sessions, so
a refused request costs no session or database work, and so the shorter webhook stack
(hotpaths/webhook_dispatch.py) keeps it.

When the cache cannot be reached (Redis restarting) requests pass uncounted and a warning is logged:
a limiter outage must not become an outage of notice intake, which the outbox keeps working through
a broker outage. django-ratelimit lets the cache's exception through (it catches only a DNS failure
on add()), so the call is wrapped here; RATELIMIT_FAIL_OPEN (settings.py) covers its other miss,
a count that vanished between add() and incr().

Limits are the SPOTPIPE_RATELIMIT_* tunables (controlplane/tunables.py: requests per client IP per
window; 0 disables a rule). The enrolment key is a bearer secret worth guessing, so enrolment has
a budget of its own; both login forms share one (one group).

The webhook default (100/s sustained per IP) sits far above what any one cloud sends a team, yet a
single load generator benchmarking 1,000 notices/s for a few seconds fits within the window; for
longer benchmarks raise it or set it to 0. Loopback is not exempt by default: behind a reverse proxy
on the same host every client would look like 127.0.0.1 and would then be exempt too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse, JsonResponse
from django_ratelimit import ALL
from django_ratelimit.core import get_usage

from controlplane.tunables import tunable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    name: str  # django-ratelimit's group: rules with one name share one budget
    prefix: str
    methods: tuple[str, ...] | None  # None: every method
    limit: int


def rules() -> list[Rule]:
    """The rules, read from the environment each time (cheap; lets tests and operators change them)."""
    return [
        Rule("login", "/accounts/login/", ("POST",), tunable("SPOTPIPE_RATELIMIT_LOGIN")),
        # The admin site's own login form: the same password guesses, so the same budget (name).
        Rule("login", "/admin/login/", ("POST",), tunable("SPOTPIPE_RATELIMIT_LOGIN")),
        Rule("enroll", "/api/v1/agents/enroll/", ("POST",), tunable("SPOTPIPE_RATELIMIT_ENROLL")),
        Rule("webhooks", "/api/v1/webhooks/", None, tunable("SPOTPIPE_RATELIMIT_WEBHOOKS")),
    ]


def window_s() -> int:
    return max(int(tunable("SPOTPIPE_RATELIMIT_WINDOW_S")), 1)


def client_ip(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is client-controlled unless a trusted proxy rewrites it, and
    # a limiter keyed on a spoofable header limits nothing.
    return request.META.get("REMOTE_ADDR") or "unknown"


def _key(group: str, request: HttpRequest) -> str:
    # A key function rather than django-ratelimit's "ip": the same address as client_ip() (the API
    # throttles' key too), and an empty REMOTE_ADDR is one "unknown" client instead of a 500.
    return client_ip(request)


def _exempt(ip: str) -> bool:
    if not tunable("SPOTPIPE_RATELIMIT_EXEMPT_LOOPBACK"):
        return False
    return ip in {"127.0.0.1", "::1"}


def _usage(request: HttpRequest, rule: Rule, window: int) -> dict | None:
    """django-ratelimit's count for this request (incremented), or None when nothing was counted."""
    try:
        return get_usage(request, group=rule.name, key=_key, rate=(rule.limit, window),
                         method=list(rule.methods) if rule.methods else ALL, increment=True)
    except Exception as exc:  # the cache's server is down: count nothing rather than refuse everything
        log.warning("rate limit not counted: cache unreachable (%s)", type(exc).__name__)
        return None


class RateLimitMiddleware:
    """Answers 429 with Retry-After once a client exceeds a rule's limit in its current window."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = self._check(request)
        return refused if refused is not None else self.get_response(request)

    def _check(self, request: HttpRequest) -> HttpResponse | None:
        if _exempt(client_ip(request)):
            return None
        for rule in rules():
            if rule.limit <= 0 or not request.path.startswith(rule.prefix):
                continue
            window = window_s()
            usage = _usage(request, rule, window)
            if usage is None or not usage["should_limit"]:
                continue
            response = JsonResponse(
                {"detail": f"rate limit exceeded: at most {rule.limit} requests per {window}s to {rule.prefix}"},
                status=429,
            )
            response["Retry-After"] = str(max(int(usage["time_left"]), 1))
            return response
        return None
