"""Operator actions of the fleet and notices pages (issue 21): terminate a live instance, retry a
failed notice. Team admins only (a member's POST answers 403, another team's object 404); each
calls the service its API action calls (`orchestration.services.instance_terminate`,
`fleet.notices.notice_retry`) and redirects back with a message, also when the service refuses."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from controlplane.common.errors import DomainError
from controlplane.fleet.notices import notice_retry
from controlplane.orchestration.api.serializers import TerminateSerializer
from controlplane.orchestration.providers.base import ProviderError
from controlplane.orchestration.services import instance_terminate
from frontend.access import admin_team_ids, instance_for_request, notice_for_request


def _first_error(errors: dict) -> str:
    field, problems = next(iter(errors.items()))
    return f"{field}: {problems[0]}"


@login_required
@require_POST
def instance_terminate_view(request: HttpRequest, instance_id: int) -> HttpResponse:
    """End a node now: the provider terminates it, its billing closes, its agent token is revoked
    and a job it served reacts as to any leave. A provider that refuses changes nothing."""
    instance = instance_for_request(request, instance_id)
    if instance.team_id not in admin_team_ids(request):
        return HttpResponseForbidden("only admins of the instance's team may terminate it")
    form = TerminateSerializer(data={"reason": request.POST.get("reason", "").strip()})  # the API's input rule
    if not form.is_valid():
        messages.error(request, _first_error(form.errors))
        return redirect("frontend:fleet")
    label = instance.provider_instance_id or f"instance {instance.pk}"
    reason = form.validated_data.get("reason") or f"terminated by {request.user.username} from the dashboard"
    try:
        instance_terminate(instance=instance, reason=reason)
    except DomainError as error:
        messages.error(request, error.message)
    except ProviderError as error:
        messages.error(request, f"The provider did not terminate {label}; nothing changed: {error}"[:300])
    else:
        messages.success(request, f"{label} terminated.")
    return redirect("frontend:fleet")


@login_required
@require_POST
def notice_retry_view(request: HttpRequest, notice_id: int) -> HttpResponse:
    """Process a failed notice again (only a failed one: any other status is refused)."""
    notice = notice_for_request(request, notice_id)
    if notice.team_id not in admin_team_ids(request):
        return HttpResponseForbidden("only admins of the notice's team may retry it")
    try:
        notice_retry(notice=notice)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Notice {notice.pk} ({notice.provider_instance_id}) will be processed again.")
    return redirect("frontend:notices")
