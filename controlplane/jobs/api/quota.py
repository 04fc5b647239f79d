"""`/api/v1/teams/{id}/quota/`: a team's queue limits (`controlplane.jobs.admission`). Team admins
read and change them; PATCH changes the limits it names, PUT sets all three (a limit left out of
either stays as it was; null removes one)."""

from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.api.access import UsersOnly
from controlplane.accounts.scoping import admin_team_ids_for_request, team_ids_for_request
from controlplane.common.api import validate_or_400
from controlplane.common.fields import CharField
from controlplane.common.limits import MAX_COUNT
from controlplane.jobs.admission import team_quota_set, team_quota_view
from controlplane.jobs.services import MAX_BUDGET_USD


class TeamQuotaInputSerializer(serializers.Serializer):
    max_nodes = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_COUNT,
                                         help_text="Nodes the team's admitted jobs may claim at once (null: no limit).")
    max_jobs = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_COUNT,
                                        help_text="Jobs admitted at once (null: no limit).")
    monthly_budget_usd = serializers.DecimalField(
        max_digits=12, decimal_places=2, required=False, allow_null=True, min_value=Decimal("0.01"),
        max_value=MAX_BUDGET_USD, help_text="Spend per calendar month, UTC (null: no limit).")


class QueuedJobSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    position = serializers.IntegerField(help_text="1: admitted next.")
    reason = CharField(help_text="Why it waits.")


class TeamQuotaSerializer(serializers.Serializer):
    team = serializers.IntegerField()
    max_nodes = serializers.IntegerField(allow_null=True)
    max_jobs = serializers.IntegerField(allow_null=True)
    monthly_budget_usd = serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True)
    jobs_admitted = serializers.IntegerField(help_text="Jobs of the team not queued and not ended.")
    nodes_claimed = serializers.IntegerField(help_text="The nodes their plans claim.")
    month_spent_usd = CharField(help_text="Spend this calendar month (UTC), metered.")
    month_usd_per_hour = CharField(help_text="The team's spend rate now.")
    queue = QueuedJobSerializer(many=True)


ERRORS = {
    400: OpenApiResponse(description="A bad limit (negative, not a number), named."),
    401: OpenApiResponse(description="No or a bad token."),
    403: OpenApiResponse(description="Not an admin of the team (or an agent token)."),
    404: OpenApiResponse(description="Not one of your teams."),
}


class TeamQuotaView(APIView):
    permission_classes = [IsAuthenticated, UsersOnly]

    def _team_id(self, request: Request, pk: str) -> int:
        if not pk.isdigit() or int(pk) not in team_ids_for_request(request):
            raise exceptions.NotFound("no such team among yours")
        if int(pk) not in admin_team_ids_for_request(request):
            raise exceptions.PermissionDenied("only the team's admins may read or change its quota")
        return int(pk)

    @extend_schema(responses={200: TeamQuotaSerializer, **ERRORS})
    def get(self, request: Request, pk: str) -> Response:
        """The team's limits, what its jobs use of them, and its queue."""
        return Response(TeamQuotaSerializer(team_quota_view(team_id=self._team_id(request, pk))).data)

    def _set(self, request: Request, pk: str) -> Response:
        team_id = self._team_id(request, pk)
        changes = validate_or_400(TeamQuotaInputSerializer(data=request.data, partial=True))
        team_quota_set(team_id=team_id, changes=dict(changes))
        return Response(TeamQuotaSerializer(team_quota_view(team_id=team_id)).data)

    @extend_schema(request=TeamQuotaInputSerializer, responses={
        200: TeamQuotaSerializer, 409: OpenApiResponse(description="A limit below what the team holds now."),
        **ERRORS})
    def put(self, request: Request, pk: str) -> Response:
        """Set the limits given (one left out stays as it was; null removes it)."""
        return self._set(request, pk)

    @extend_schema(request=TeamQuotaInputSerializer, responses={
        200: TeamQuotaSerializer, 409: OpenApiResponse(description="A limit below what the team holds now."),
        **ERRORS})
    def patch(self, request: Request, pk: str) -> Response:
        """Change the limits given; the others stay as they were."""
        return self._set(request, pk)
