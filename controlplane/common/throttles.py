"""API throttles: DRF's `SimpleRateThrottle` on Django's cache, which settings.py shares between
processes (Redis in production, files under SPOTPIPE_VAR_DIR on the embedded default), so N web
processes allow the rate once, not N times.

Two rates, both tunables (controlplane/tunables.py, in DRF's form: "N/second", "/minute", "/hour"
or "/day"):
- `SPOTPIPE_THROTTLE_API`: every API request, per principal: a user, one agent (its instance, so a
  fleet of agents under one team never shares a budget), or an anonymous client's IP.
- `SPOTPIPE_THROTTLE_PLANS`: `POST /api/v1/plans/` per principal on top, since each one runs the
  planner (CPU for tens to hundreds of milliseconds).

A refused request gets 429 with `Retry-After`. When the cache cannot be reached the request passes
uncounted and a warning is logged, as the login and webhook limits do (observability/ratelimit.py):
a limiter outage must not become an API outage."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rest_framework.throttling import SimpleRateThrottle

from controlplane.observability.ratelimit import client_ip
from controlplane.tunables import tunable

if TYPE_CHECKING:  # DRF's views import this module (DEFAULT_THROTTLE_CLASSES): no import back at runtime
    from rest_framework.request import Request
    from rest_framework.views import APIView

log = logging.getLogger(__name__)


class _TunableRateThrottle(SimpleRateThrottle):
    """A throttle whose rate is a tunable read per request, keyed by principal, failing open."""

    rate_tunable = ""

    def __init__(self) -> None:
        # SimpleRateThrottle reads the rate at construction (one per request): from the tunable.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)

    def get_rate(self) -> str | None:
        rate = str(tunable(self.rate_tunable)).strip()
        return rate if rate and rate != "0" else None

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        user = request.user
        instance_id = getattr(user, "instance_id", None)
        if getattr(user, "token", None) is not None and instance_id is not None:
            ident = f"agent-{instance_id}"
        elif user is not None and user.is_authenticated and user.pk is not None:
            ident = f"user-{user.pk}"
        else:
            ident = f"ip-{client_ip(request._request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request: Request, view: APIView) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # the cache's server is down: count nothing rather than refuse everything
            log.warning("API throttle %s not counted: cache unreachable (%s)", self.scope, type(exc).__name__)
            return True


class ApiRateThrottle(_TunableRateThrottle):
    scope = "api"
    rate_tunable = "SPOTPIPE_THROTTLE_API"


class PlanRateThrottle(_TunableRateThrottle):
    scope = "plans"
    rate_tunable = "SPOTPIPE_THROTTLE_PLANS"
