"""POST /api/v1/plans/: plan a job (instance type x nodes x DP x PP) with current prices and risk,
by the planning app's services; the jobs API's since it may plan a stored job (`job`)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.api.access import UsersOnly
from controlplane.accounts.scoping import team_ids_for_request
from controlplane.common.api import validate_or_400
from controlplane.common.throttles import ApiRateThrottle, PlanRateThrottle
from controlplane.jobs.api.plan_serializers import ModelSpecSerializer, PlanRequestSerializer
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.selectors import plan_input_from_job
from controlplane.planning.services import PlanInfeasible, PlanInput, plan_compute, plan_estimate
from runtime.planner.capacity_policy import DEFAULT_CAPACITY_POLICY


class PlanView(APIView):
    """Plan a job; 422 with `nearest` when no plan satisfies the deadline, budget or memory."""

    permission_classes = [IsAuthenticated, UsersOnly]
    throttle_classes = [ApiRateThrottle, PlanRateThrottle]

    @extend_schema(
        request=PlanRequestSerializer,
        responses={
            200: OpenApiResponse(description="best plan, templates, alternatives (hours, cost, risk), pools, and "
                                             "`estimate`: the best plan's figures for the capacity policy (spot "
                                             "cost, and the all-on-demand ceiling: on_demand_cost_usd)"),
            400: OpenApiResponse(description="bad input: detail and errors.<field>"),
            404: OpenApiResponse(description="the job is not one of your team's"),
            422: OpenApiResponse(description="infeasible: detail, errors.<field> and the nearest feasible plan"),
            429: OpenApiResponse(description="too many plans: SPOTPIPE_THROTTLE_PLANS per principal; Retry-After"),
        },
    )
    def post(self, request: Request) -> Response:
        data = validate_or_400(PlanRequestSerializer(data=request.data))
        team_ids = team_ids_for_request(request)
        at = timezone.now()
        overrides = {
            "instance_types": data["instance_types"],
            "zones": data.get("zones"),
            "deadline_hours": data.get("deadline_hours"),
            "budget_usd": data.get("budget_usd"),
            "strategy": data.get("strategy"),
            "max_nodes": data.get("max_nodes"),
            "microbatch_size": data.get("microbatch_size"),
            "global_batch": data.get("global_batch"),
            "samples": data.get("samples"),
        }
        if "model" in data:
            overrides["model"] = ModelSpecSerializer().to_spec(data["model"])
        capacity = data.get("capacity") or DEFAULT_CAPACITY_POLICY
        if "job" in data:
            # Another team's job answers 404, never 403.
            job = TrainingJob.objects.filter(pk=data["job"], team_id__in=team_ids).first()
            if job is None:
                raise exceptions.NotFound(f"no job {data['job']}")
            plan_input = plan_input_from_job(job=job, at=at, **overrides)
            capacity = data.get("capacity") or job.capacity
        else:
            plan_input = PlanInput(**{k: v for k, v in overrides.items() if v is not None})
        try:
            plan, pools = plan_compute(data=plan_input, team_ids=team_ids, at=at)
        except PlanInfeasible as exc:
            return Response(
                {
                    "detail": exc.message,
                    "errors": {exc.field: [exc.message]},
                    "nearest": exc.nearest.to_dict() if exc.nearest else None,
                },
                status=422,
            )
        body = plan.to_dict()
        body["estimate"] = plan_estimate(plan, capacity=capacity)
        body["pools"] = [
            {
                "instance_type": p.instance_type,
                "zone": p.zone,
                "spot_usd_per_hour": p.spot_usd_per_hour,
                "preemptions_per_node_hour": p.preemptions_per_node_hour,
                "risk_source": p.risk_source,
            }
            for p in pools
        ]
        return Response(body)
