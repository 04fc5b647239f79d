"""A job's cost report (`GET /jobs/{id}/cost-report/`): billing's report of the job's segments,
scoped to the requester's teams (another team's job answers 404). Node agents are refused."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from controlplane.accounts.api.access import UsersOnly
from controlplane.accounts.scoping import team_ids_for_request
from controlplane.billing.api.renderers import CSVRenderer
from controlplane.billing.api.serializers import CostReportQuery, CostReportSerializer
from controlplane.billing.reports import job_cost_report
from controlplane.common.api import validated_query
from controlplane.jobs.models import TrainingJob


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
