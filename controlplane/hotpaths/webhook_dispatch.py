"""A WSGI application that sends the inbound webhook receivers through a shorter middleware stack.

The receivers are plain Django views that use neither sessions, users, messages, CSRF (they are
exempt) nor static files, yet every middleware of the site runs for each request. At 1,000 notices
per second that is a measurable share of the CPU (about 0.12 to 0.16 ms of the 0.5 to 0.7 ms that
Django spent on a notice in process when this path was added; the method is in docs/webhooks.md's
git history, and `python -m bench webhooks` measures the intake as a whole).
The webhook stack keeps what matters for them: security headers, the per-IP rate limit, the log
context and the frame-options header. Every other path goes to Django's usual handler."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

WEBHOOK_PREFIX = "/api/v1/webhooks/"
# Middleware the webhook receivers keep, in the site's order (others are dropped for them).
WEBHOOK_MIDDLEWARE = frozenset({
    "django.middleware.security.SecurityMiddleware",
    "controlplane.observability.ratelimit.RateLimitMiddleware",
    "controlplane.observability.logs.LogContextMiddleware",
    "controlplane.common.not_found.ApiNotFoundMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
})


class WebhookWSGIHandler(WSGIHandler):
    """Django's WSGI handler with only WEBHOOK_MIDDLEWARE (in the order settings.MIDDLEWARE lists them)."""

    def load_middleware(self, is_async: bool = False) -> None:
        site = settings.MIDDLEWARE
        settings.MIDDLEWARE = [path for path in site if path in WEBHOOK_MIDDLEWARE]
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = site


class WebhookDispatch:
    """Routes `/api/v1/webhooks/...` to the webhook handler and everything else to `site`."""

    def __init__(self, site: Callable[..., Iterable[bytes]]) -> None:
        self.site = site
        self.webhooks = WebhookWSGIHandler()

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith(WEBHOOK_PREFIX):
            return self.webhooks(environ, start_response)
        return self.site(environ, start_response)
