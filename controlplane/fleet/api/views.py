"""Instances (read, plus the agent heartbeat) and interruption notices (read only here; the
webhooks app receives them). Terminating an instance is orchestration's
(`orchestration.api.views.InstanceTerminateViewSet`, the same `/instances/{id}/terminate/`)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.api.access import AgentActionsOnly, TeamScopedViewSetMixin, UsersOnly, agent_token
from controlplane.accounts.models import ApiToken
from controlplane.common.api import validate_or_400
from controlplane.common.filters import FilterBackend
from controlplane.fleet import selectors
from controlplane.fleet.api.filters import InstanceFilter, NoticeFilter
from controlplane.fleet.api.serializers import (
    HeartbeatResultSerializer,
    HeartbeatSerializer,
    InstanceEventSerializer,
    InstanceSerializer,
    NoticeSerializer,
)
from controlplane.fleet.heartbeats import instance_heartbeat_record


class InstanceViewSet(TeamScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """Instances of the requester's teams. An agent sees only its own instance."""

    serializer_class = InstanceSerializer
    permission_classes = [IsAuthenticated, AgentActionsOnly]
    filter_backends = [FilterBackend]
    filterset_class = InstanceFilter
    agent_actions = frozenset({"retrieve", "heartbeat"})

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return selectors.instance_list(team_ids=team_ids)

    def agent_scope(self, queryset: QuerySet, token: ApiToken) -> QuerySet:
        return queryset.filter(pk=token.instance_id)

    @extend_schema(responses=InstanceEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        events = selectors.instance_event_list(instance=self.get_object())
        return self.paginated_response(events, InstanceEventSerializer)

    @extend_schema(request=HeartbeatSerializer, responses={200: HeartbeatResultSerializer})
    @action(detail=True, methods=["post"])
    def heartbeat(self, request: Request, pk: str | None = None) -> Response:
        """The instance's agent says it is alive. Only that instance's agent token may call it."""
        instance = self.get_object()
        if agent_token(request) is None:
            raise exceptions.PermissionDenied("only the instance's node agent sends heartbeats")
        data = validate_or_400(HeartbeatSerializer(data=request.data or {}))
        instance = instance_heartbeat_record(instance=instance, agent_address=data.get("agent_address"))
        job = instance.job
        result = {
            "instance": instance.pk, "state": instance.state, "last_heartbeat_at": instance.last_heartbeat_at,
            "job": job.pk if job else None, "job_status": job.status if job else None,
            "current_generation": job.current_generation if job else None,
        }
        return Response(HeartbeatResultSerializer(result).data)


class NoticeViewSet(TeamScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """Interruption notices about the requester's teams' instances, newest first."""

    serializer_class = NoticeSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = NoticeFilter

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return selectors.notice_list(team_ids=team_ids)

    @extend_schema(request=None, responses={
        200: NoticeSerializer,
        401: OpenApiResponse(description="No or a bad token."),
        403: OpenApiResponse(description="Not an admin of the notice's team, or an agent token."),
        404: OpenApiResponse(description="Not one of your teams' notices."),
        409: OpenApiResponse(description="The notice is not failed (`errors.status`)."),
    })
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Process a failed notice again (team admins): back to `received` with its attempts reset,
        handed to the workers like a new notice. Only a failed notice: 409 otherwise."""
        from controlplane.accounts.scoping import admin_team_ids_for_request
        from controlplane.fleet.notices import notice_retry

        notice = self.get_object()
        if notice.team_id not in admin_team_ids_for_request(request):
            raise exceptions.PermissionDenied("only admins of the notice's team may retry it")
        notice_retry(notice=notice)
        return Response(NoticeSerializer(self.get_queryset().get(pk=notice.pk)).data)
