"""Billing API: segments and a job's cost report, scoped to the requester's teams (another team's
job answers 404). Node agents have no use for costs and are refused."""

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

from controlplane.accounts.models import Team
from controlplane.accounts.scoping import team_ids_for_request
from controlplane.billing import selectors
from controlplane.billing.api.filters import SegmentFilter
from controlplane.billing.api.renderers import CSVRenderer
from controlplane.billing.api.serializers import (
    BillingSegmentSerializer,
    CostReportQuery,
    CostReportSerializer,
    SpendReportQuery,
    TeamSpendReportSerializer,
)
from controlplane.billing.reports import job_cost_report, team_spend_report
from controlplane.common.api import UsersOnly, validated_query
from controlplane.common.filters import FilterBackend
from controlplane.jobs.models import TrainingJob


class BillingSegmentList(generics.ListAPIView):
    """Billing segments of the requester's teams, oldest first."""

    serializer_class = BillingSegmentSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = SegmentFilter

    def get_queryset(self):
        return selectors.segment_list(team_ids=team_ids_for_request(self.request))


class JobCostReport(APIView):
    """What a job cost: total, per instance type and zone, spot and on-demand capacity apart,
    against on-demand, and the cost of work lost to preemptions. JSON, or CSV (one line per segment
    and a TOTAL line, with the split in the `*_capacity_*` columns) with `?format=csv` or
    `Accept: text/csv`."""

    permission_classes = [IsAuthenticated, UsersOnly]
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, CSVRenderer]

    @extend_schema(
        parameters=[CostReportQuery],
        responses={
            (200, "application/json"): CostReportSerializer,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR,
                description="Segments and a TOTAL line; spot_capacity_* and on_demand_capacity_* columns split them.",
            ),
        },
    )
    def get(self, request: Request, pk: int) -> Response:
        params = validated_query(CostReportQuery, request)
        job = get_object_or_404(TrainingJob.objects.filter(team_id__in=team_ids_for_request(request)), pk=pk)
        report = job_cost_report(job=job, as_of=params.get("as_of"))
        if getattr(request.accepted_renderer, "format", None) == "csv":
            return Response(report.to_csv(), content_type="text/csv; charset=utf-8",
                            headers={"Content-Disposition": f'attachment; filename="job-{job.pk}-cost.csv"'})
        return Response(report.to_dict())


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
            400: OpenApiResponse(description="`start`/`end` not dates, `end` before `start`, or over 366 days."),
            401: OpenApiResponse(description="No or a bad token."),
            403: OpenApiResponse(description="Agent tokens."),
            404: OpenApiResponse(description="Not one of your teams."),
        },
    )
    def get(self, request: Request, pk: int) -> Response:
        team = get_object_or_404(Team.objects.filter(pk__in=team_ids_for_request(request)), pk=pk)
        params = validated_query(SpendReportQuery, request)
        start = datetime.combine(params["start"], time.min, tzinfo=UTC)
        end = datetime.combine(params["end"], time.min, tzinfo=UTC) + timedelta(days=1)
        report = team_spend_report(team=team, start=start, end=end)
        if getattr(request.accepted_renderer, "format", None) == "csv":
            name = f"team-{team.slug}-spend-{params['start']}-{params['end']}.csv"
            return Response(report.to_csv(), content_type="text/csv; charset=utf-8",
                            headers={"Content-Disposition": f'attachment; filename="{name}"'})
        return Response(report.to_dict())
