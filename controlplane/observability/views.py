"""`/metrics` and `/healthz`."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from controlplane.observability import health
from controlplane.tunables import tunable

LOOPBACK = {"127.0.0.1", "::1"}


def _metrics_allowed(request: HttpRequest) -> bool:
    """An operator: with SPOTPIPE_METRICS_TOKEN set, a matching `Authorization: Bearer <token>` is
    required; unset, only loopback clients (a sidecar or local Prometheus; nothing else can).
    The same rule guards /metrics and the details of /healthz."""
    expected = tunable("SPOTPIPE_METRICS_TOKEN")
    if not expected:
        return request.META.get("REMOTE_ADDR") in LOOPBACK
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _metrics_allowed(request):
        response = HttpResponse("metrics require a bearer token\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # Imported here so that the rest of the site does not depend on prometheus_client being installed.
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from controlplane.observability import metrics as prom

    return HttpResponse(prom.render(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthz_view(request: HttpRequest) -> JsonResponse:
    """Anyone: a bare liveness answer (the process serves requests), with no checks run, so
    anonymous callers can neither read exception text nor make it ping the database and workers.
    Operators (as for /metrics): the checks, 200 when all are ok, 503 naming the failing ones."""
    if not _metrics_allowed(request):
        return JsonResponse({"status": "ok"})
    ok, body = health.health()
    return JsonResponse(body, status=200 if ok else 503)
