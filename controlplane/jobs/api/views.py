"""Training jobs: submit, list, cancel, resume, and each job's generations, reconfigurations,
events and metrics. Agents may read their own job, its generations and metrics, and post metrics."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.api.access import AgentActionsOnly, TeamScopedViewSetMixin, agent_token, resolve_team
from controlplane.accounts.models import ApiToken
from controlplane.common.api import validate_or_400
from controlplane.common.filters import FilterBackend
from controlplane.fleet.models import Instance
from controlplane.jobs import artifacts, selectors, services
from controlplane.jobs.api.filters import JobEventFilter, JobFilter, MetricFilter
from controlplane.jobs.api.serializers import (
    ArtifactListSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobGenerationSerializer,
    JobResumedSerializer,
    JobResumeSerializer,
    JobSerializer,
    JobSubmitSerializer,
    MetricBatchResultSerializer,
    MetricBatchSerializer,
    MetricSampleSerializer,
    ReconfigurationSerializer,
)
from controlplane.jobs.models import TrainingJob


class JobViewSet(TeamScopedViewSetMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Training jobs of the requester's teams."""

    serializer_class = JobSerializer
    permission_classes = [IsAuthenticated, AgentActionsOnly]
    filter_backends = [FilterBackend]
    filterset_class = JobFilter
    filterset_classes = {"metrics": MetricFilter, "events": JobEventFilter}
    agent_actions = frozenset({"retrieve", "generations", "metrics", "metrics_create"})

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return selectors.job_list(team_ids=team_ids)

    def agent_scope(self, queryset: QuerySet, token: ApiToken) -> QuerySet:
        # The job the agent's instance works for, and nothing else.
        return queryset.filter(pk__in=Instance.objects.filter(pk=token.instance_id).values("job_id"))

    def _job(self) -> TrainingJob:
        return self.get_object()

    def get_serializer_class(self) -> type:
        return JobSerializer if self.action == "list" else JobDetailSerializer

    @extend_schema(request=JobSubmitSerializer, responses={201: JobDetailSerializer})
    def create(self, request: Request) -> Response:
        data = validate_or_400(JobSubmitSerializer(data=request.data))
        team = resolve_team(request, data.pop("team", None))
        job = services.job_submit(team=team, user=request.user, **data)
        return Response(JobDetailSerializer(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = services.job_cancel(job=self._job(), user=request.user)
        return Response(JobDetailSerializer(job).data)

    @extend_schema(request=JobResumeSerializer, responses={200: JobResumedSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        data = validate_or_400(JobResumeSerializer(data=request.data or {}))
        job = services.job_resume(job=self._job(), user=request.user, budget_usd=data["budget_usd"])
        resumed = job.events.filter(kind="resumed").order_by("-at", "-id").first()
        job.resumed_from = {"step": resumed.data.get("from_step", 0),
                            "checkpoint": resumed.data.get("from_checkpoint", False), "message": resumed.message}
        return Response(JobResumedSerializer(job).data)

    @extend_schema(responses=JobGenerationSerializer(many=True))
    @action(detail=True, methods=["get"])
    def generations(self, request: Request, pk: str | None = None) -> Response:
        return self.paginated_response(selectors.job_generation_list(job=self._job()), JobGenerationSerializer)

    @extend_schema(responses=ReconfigurationSerializer(many=True))
    @action(detail=True, methods=["get"])
    def reconfigurations(self, request: Request, pk: str | None = None) -> Response:
        return self.paginated_response(selectors.job_reconfiguration_list(job=self._job()), ReconfigurationSerializer)

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        events = self.filter_queryset(selectors.job_event_list(job=self._job()))
        return self.paginated_response(events, JobEventSerializer)

    @extend_schema(responses=ArtifactListSerializer)
    @action(detail=True, methods=["get"], pagination_class=None)
    def artifacts(self, request: Request, pk: str | None = None) -> Response:
        """The job's final weights (safetensors, Hugging Face layout) with sizes and sha256; empty
        until every worker's export is in."""
        summary = artifacts.job_artifacts_summary(job=self._job(), base_url=request.build_absolute_uri("/")[:-1])
        return Response(ArtifactListSerializer(summary).data)

    @extend_schema(
        operation_id="jobs_artifacts_download",
        parameters=[OpenApiParameter("name", OpenApiTypes.STR, OpenApiParameter.PATH,
                                     description="A file name from the artifacts listing.")],
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The file."),
                   404: OpenApiResponse(description="No such job for this token, or no such file in its listing.")},
    )
    def artifact_download(self, request: Request, pk: str | None = None, name: str = "") -> FileResponse:
        """One file of the job's artifacts listing, streamed (only names the listing has)."""
        artifact, stream = artifacts.job_artifact_open(job=self._job(), name=name)
        response = FileResponse(stream, as_attachment=True, filename=artifact.name.rpartition("/")[2],
                                content_type="application/octet-stream")
        response["Content-Length"] = str(artifact.size)
        response["X-Checksum-SHA256"] = artifact.sha256
        return response

    @extend_schema(responses=MetricSampleSerializer(many=True))
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        samples = self.filter_queryset(selectors.job_metric_list(job=self._job()))
        return self.paginated_response(samples, MetricSampleSerializer)

    @extend_schema(request=MetricBatchSerializer, responses={201: MetricBatchResultSerializer})
    @metrics.mapping.post
    def metrics_create(self, request: Request, pk: str | None = None) -> Response:
        """Store a batch of samples, all or nothing. Agents report for their own instance."""
        job = self._job()
        body: Any = request.data
        if isinstance(body, list):
            body = {"samples": body}
        samples = [dict(s) for s in validate_or_400(MetricBatchSerializer(data=body, context={"job": job}))["samples"]]
        token = agent_token(request)
        if token is not None:
            for index, sample in enumerate(samples):
                if sample.get("instance") not in (None, token.instance_id):
                    raise exceptions.ValidationError(
                        {f"samples[{index}].instance": ["an agent reports only for its own instance"]}
                    )
                sample["instance"] = token.instance_id
        stored = services.job_record_metrics(job=job, samples=samples)
        result = {"stored": len(stored), "steps_done": job.steps_done, "samples_done": job.samples_done,
                  "last_loss": job.last_loss, "last_val_loss": job.last_val_loss}
        return Response(MetricBatchResultSerializer(result).data, status=status.HTTP_201_CREATED)
