"""Who may see what on the dashboard: the session user's teams, another team's job answers 404
(never 403, so ids of other teams cannot be probed), and data endpoints answer JSON errors
instead of redirecting to the login page."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404

from controlplane.accounts.scoping import admin_team_ids_for_request, team_ids_for_request
from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.jobs.models import TrainingJob


def visible_team_ids(request: HttpRequest) -> list[int]:
    """Teams the session user belongs to."""
    return team_ids_for_request(request)


def admin_team_ids(request: HttpRequest) -> list[int]:
    return admin_team_ids_for_request(request)


def job_for_request(request: HttpRequest, job_id: int) -> TrainingJob:
    """The job if it belongs to one of the user's teams; 404 otherwise."""
    return get_object_or_404(TrainingJob.objects.select_related("team"), pk=job_id,
                             team_id__in=visible_team_ids(request))


def instance_for_request(request: HttpRequest, instance_id: int) -> Instance:
    """The instance if it belongs to one of the user's teams; 404 otherwise."""
    return get_object_or_404(Instance, pk=instance_id, team_id__in=visible_team_ids(request))


def notice_for_request(request: HttpRequest, notice_id: int) -> InterruptionNotice:
    """The notice if it is about one of the user's teams; 404 otherwise."""
    return get_object_or_404(InterruptionNotice, pk=notice_id, team_id__in=visible_team_ids(request))


def data_endpoint(view: Callable[..., dict[str, Any] | HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a view that returns a dict into a JSON endpoint: 401 for anonymous users, 404 as JSON,
    never cached (the numbers are live)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return JsonResponse({"detail": "authentication required; log in at /accounts/login/"}, status=401)
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"detail": f"method {request.method} not allowed; use GET"}, status=405)
        try:
            result = view(request, *args, **kwargs)
        except Http404:
            return JsonResponse({"detail": "not found"}, status=404)
        response = result if isinstance(result, HttpResponse) else JsonResponse(result, encoder=DjangoJSONEncoder)
        response["Cache-Control"] = "no-store"
        return response

    return wrapper
