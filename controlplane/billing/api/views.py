"""Billing API: segments and a team's spend, scoped to the requester's teams (another team answers
404). A job's cost report is the jobs API's (`jobs.api.cost`), on billing's report. Node agents have
no use for costs and are refused."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from controlplane.accounts.api.access import UsersOnly
from controlplane.accounts.models import Team
from controlplane.accounts.scoping import team_ids_for_request
from controlplane.billing import selectors
from controlplane.billing.api.filters import SegmentFilter
from controlplane.billing.api.renderers import CSVRenderer
from controlplane.billing.api.serializers import (
    BillingSegmentSerializer,
    SpendReportQuery,
    TeamSpendReportSerializer,
)
from controlplane.billing.reports import team_spend_report
from controlplane.common.api import validated_query
from controlplane.common.filters import FilterBackend


class BillingSegmentList(generics.ListAPIView):
    """Billing segments of the requester's teams, oldest first."""

    serializer_class = BillingSegmentSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = SegmentFilter

    def get_queryset(self):
        return selectors.segment_list(team_ids=team_ids_for_request(self.request))


class TeamSpendReport(APIView):
    """What a team's instances cost, per UTC day and per job, over `start`..`end` (days, both
    included; default the last 30 days). JSON, or CSV (one line per day and job with spend, then a
    TOTAL line) with `?format=csv` or `Accept: text/csv`. Every member of the team may read it."""

    permission_classes = [IsAuthenticated, UsersOnly]
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, CSVRenderer]

    @extend_schema(
        parameters=[SpendReportQuery],
        responses={
            (200, "application/json"): TeamSpendReportSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="day,job,job_name,hours,cost_usd,"
                                                                             "on_demand_cost_usd and a TOTAL line."),
            400: OpenApiResponse(description="`start`/`end` not dates, `end` before `start` or on 9999-12-31, or "
                                             "over 366 days."),
            401: OpenApiResponse(description="No or a bad token."),
            403: OpenApiResponse(description="Agent tokens."),
            404: OpenApiResponse(description="Not one of your teams."),
        },
    )
    def get(self, request: Request, pk: int) -> Response:
        team = get_object_or_404(Team.objects.filter(pk__in=team_ids_for_request(request)), pk=pk)
        params = validated_query(SpendReportQuery, request)
        start = datetime.combine(params["start"], time.min, tzinfo=UTC)
        # The midnight after the last day, which spend_window_problem keeps before date.max.
        end = datetime.combine(params["end"], time.min, tzinfo=UTC) + timedelta(days=1)
        report = team_spend_report(team=team, start=start, end=end)
        if getattr(request.accepted_renderer, "format", None) == "csv":
            name = f"team-{team.slug}-spend-{params['start']}-{params['end']}.csv"
            return Response(report.to_csv(), content_type="text/csv; charset=utf-8",
                            headers={"Content-Disposition": f'attachment; filename="{name}"'})
        return Response(report.to_dict())
