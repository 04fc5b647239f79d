"""The agent protocol: enrol, long-poll for commands, forward notices, report worker events.

Heartbeats go to `POST /api/v1/instances/{id}/heartbeat/` (fleet) and metrics to
`POST /api/v1/jobs/{id}/metrics/` (jobs); see docs/orchestration.md."""

from __future__ import annotations

import time

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.api.access import TeamScopedViewSetMixin, UsersOnly, agent_token
from controlplane.accounts.scoping import admin_team_ids_for_request, team_ids_for_request
from controlplane.accounts.selectors import agent_token_live
from controlplane.accounts.services import agent_token_rotate
from controlplane.common.api import validate_or_400, validated_query
from controlplane.common.errors import DomainError
from controlplane.fleet import selectors as fleet_selectors
from controlplane.fleet.api.serializers import InstanceSerializer
from controlplane.fleet.models import Instance
from controlplane.jobs.prepare_step import ShareReport
from controlplane.orchestration import selectors, services
from controlplane.orchestration.api.serializers import (
    AgentEventSerializer,
    AgentNoticeResultSerializer,
    AgentNoticeSerializer,
    AgentProfileSerializer,
    AgentShareClaimSerializer,
    AgentShareReportSerializer,
    AgentTokenRotatedSerializer,
    CommandsQuerySerializer,
    CommandsSerializer,
    EnrollResultSerializer,
    EnrollSerializer,
    TerminateSerializer,
    UnavailableOfferingListSerializer,
    UnavailableOfferingsQuerySerializer,
)
from controlplane.orchestration.offerings import unavailable_offerings_for_teams
from controlplane.orchestration.providers.base import ProviderError
from runtime.config import LayoutError

# How often a long-poll held by this (WSGI) view looks at the database: one indexed single-row query.
POLL_INTERVAL_S = 0.025
# Set in the WSGI environ by the ASGI entry point (controlplane/asgi.py), which holds the request
# itself without a thread: the view then answers at once, whatever `wait` says, and when the
# agent's version is current and it asked to wait, with only HOLD_HEADER (`<instance> <job>`) and
# no answer: the channel holds the poll and reads the answer itself when it is time to send one.
HELD_BY_AGENT_CHANNEL = "spotpipe.agent_channel"
HOLD_HEADER = "X-Spotpipe-Hold"


class AgentsOnly(BasePermission):
    message = "only node agent tokens may use this endpoint"

    def has_permission(self, request: Request, view: object) -> bool:
        return agent_token(request) is not None


def _agent_instance(request: Request) -> Instance:
    token = agent_token(request)
    instance = Instance.objects.filter(pk=token.instance_id, team_id=token.team_id).first() if token else None
    if instance is None:
        raise exceptions.NotFound("the token's instance does not exist")
    return instance


class EnrollView(APIView):
    """A new node exchanges its acquisition's enrolment key for an agent token."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=EnrollSerializer, responses={
        201: EnrollResultSerializer,
        400: OpenApiResponse(description="bad input or an unknown enrolment key: detail and errors.<field>"),
        403: OpenApiResponse(description="aws: the signed instance identity document does not prove this node is "
                                         "the launched instance in the configured account and region"),
        409: OpenApiResponse(description="the node is not attached to its acquisition yet (retry) or has ended"),
    })
    def post(self, request: Request) -> Response:
        data = validate_or_400(EnrollSerializer(data=request.data))
        instance, key = services.agent_enroll(
            enroll_key=data["enroll_key"], provider_instance_id=data["provider_instance_id"],
            address=data.get("agent_address", ""), identity_document=data["identity_document"],
            identity_signature=data["identity_signature"],
        )
        token = agent_token_live(instance_id=instance.pk)
        return Response({"instance": instance.pk, "job": instance.job_id, "token": key,
                         "expires_at": token.expires_at if token else None}, status=status.HTTP_201_CREATED)


class AgentTokenView(APIView):
    """Rotation: the agent trades its live token for a new one before it expires."""

    permission_classes = [AgentsOnly]

    @extend_schema(request=None, responses={
        201: AgentTokenRotatedSerializer,
        401: OpenApiResponse(description="the token is invalid, revoked (its instance ended) or expired"),
        409: OpenApiResponse(description="the instance ended or the token was revoked meanwhile"),
    })
    def post(self, request: Request) -> Response:
        token, key = agent_token_rotate(token=agent_token(request))
        return Response({"instance": token.instance_id, "token": key, "expires_at": token.expires_at},
                        status=status.HTTP_201_CREATED)


class CommandsView(APIView):
    """Long-poll: answers at once when the agent's view (`version`) is stale, else holds the request
    up to `wait` seconds until the instance, its job's status or its generation changes.

    Under the production server (ASGI, controlplane/asgi.py) this view only authenticates,
    validates and answers at once; the hold happens in the agent channel, without a thread. Under
    a WSGI server (the embedded default's runserver, tests) it holds here, polling every 25 ms."""

    permission_classes = [AgentsOnly]

    @extend_schema(parameters=[CommandsQuerySerializer], responses={200: CommandsSerializer})
    def get(self, request: Request) -> Response:
        query = validate_or_400(CommandsQuerySerializer(data=request.query_params))
        instance_id = agent_token(request).instance_id
        if request.META.get(HELD_BY_AGENT_CHANNEL):
            version, job_id = selectors.agent_command_version(instance_id=instance_id)
            if version == query["version"] and query["wait"] > 0:
                return Response(status=status.HTTP_204_NO_CONTENT, headers={HOLD_HEADER: f"{instance_id} {job_id}"})
            return Response(services.agent_commands(instance_id=instance_id))
        deadline = time.monotonic() + query["wait"]
        while True:
            version, _ = selectors.agent_command_version(instance_id=instance_id)
            if version != query["version"] or time.monotonic() >= deadline:
                break
            time.sleep(POLL_INTERVAL_S)
        return Response(services.agent_commands(instance_id=instance_id))


class AgentNoticeView(APIView):
    """The agent saw an interruption (or rebalance) notice in its metadata endpoint."""

    permission_classes = [AgentsOnly]

    @extend_schema(request=AgentNoticeSerializer, responses={202: AgentNoticeResultSerializer})
    def post(self, request: Request) -> Response:
        data = validate_or_400(AgentNoticeSerializer(data=request.data))
        notice_id = services.agent_notice(
            instance=_agent_instance(request), kind=data["kind"], action=data["action"], deadline=data["deadline"],
            cloud=data["cloud"], payload=data["raw"],
        )
        return Response({"notice": notice_id, "duplicate": notice_id is None}, status=status.HTTP_202_ACCEPTED)


class AgentProfileView(APIView):
    """`POST /api/v1/agents/profile/`: the first node of a job submitted with `plan: auto` and a model
    function without its measures reports what it measured; the job is planned from it."""

    permission_classes = [AgentsOnly]

    @extend_schema(request=AgentProfileSerializer, responses={
        202: None,
        400: OpenApiResponse(description="Not a profile (`errors.profile.<field>`); the job is unchanged."),
        409: OpenApiResponse(description="The job does not wait for a profile."),
    })
    def post(self, request: Request) -> Response:
        data = validate_or_400(AgentProfileSerializer(data=request.data))
        try:
            services.job_profile_received(instance=_agent_instance(request), profile=data)
        except LayoutError as exc:
            raise DomainError(exc.message, field=exc.field) from None
        return Response(status=status.HTTP_202_ACCEPTED)


class AgentShareClaimView(APIView):
    """`POST /api/v1/agents/prepare/claim/`: a node of a job in its prepare step (`config.data.prepare`)
    asks for the share of the source's files it prepares next."""

    permission_classes = [AgentsOnly]

    @extend_schema(request=None, responses={
        200: AgentShareClaimSerializer,
        409: OpenApiResponse(description="The node runs no job."),
    })
    def post(self, request: Request) -> Response:
        return Response(services.share_claim(instance=_agent_instance(request)).to_dict())


class AgentShareReportView(APIView):
    """`POST /api/v1/agents/prepare/done/`: a node prepared the share it held; after the last share
    the job trains on the prepared corpus."""

    permission_classes = [AgentsOnly]

    @extend_schema(request=AgentShareReportSerializer, responses={
        202: None,
        400: OpenApiResponse(description="Not a share of the step (`errors.share`); nothing is recorded."),
        409: OpenApiResponse(description="The share is another node's now, or the step is over."),
    })
    def post(self, request: Request) -> Response:
        data = validate_or_400(AgentShareReportSerializer(data=request.data))
        report = ShareReport(number=data["share"], of=data["of"], index_written=data["index_written"],
                             files=data["files"], input_bytes=data["input_bytes"], seconds=data["seconds"])
        services.share_report(instance=_agent_instance(request), report=report)
        return Response(status=status.HTTP_202_ACCEPTED)


class AgentEventView(APIView):
    """The agent reports what its workers did (started, applied a generation, exited)."""

    permission_classes = [AgentsOnly]

    @extend_schema(request=AgentEventSerializer, responses={
        202: OpenApiResponse(description="Recorded and acted on, or a replay of an event (same `id`) that was."),
        400: OpenApiResponse(description="Bad input (`errors.<field>`); nothing is recorded."),
    })
    def post(self, request: Request) -> Response:
        data = validate_or_400(AgentEventSerializer(data=request.data))
        services.agent_event(instance=_agent_instance(request), kind=data["kind"], event_id=data["id"],
                             generation=data["generation"], step=data["step"], code=data["code"],
                             message=data["message"], log_tail=data["log_tail"])
        return Response(status=status.HTTP_202_ACCEPTED)


class UnavailableOfferingsView(APIView):
    """`GET /api/v1/offerings/unavailable/`: the offerings launches skip now, with why and until
    when: every team's no-capacity marks, and the requester's teams' preemption cool-downs."""

    permission_classes = [IsAuthenticated, UsersOnly]

    @extend_schema(parameters=[UnavailableOfferingsQuerySerializer],
                   responses={200: UnavailableOfferingListSerializer})
    def get(self, request: Request) -> Response:
        query = validated_query(UnavailableOfferingsQuerySerializer, request)
        listed = unavailable_offerings_for_teams(team_ids=team_ids_for_request(request),
                                                 provider=query.get("provider") or None)
        return Response({"count": len(listed), "results": [u.to_dict() for u in listed]})


class ProviderUnavailable(exceptions.APIException):
    status_code = 502
    default_detail = "the cloud provider did not answer"


class InstanceTerminateViewSet(TeamScopedViewSetMixin, viewsets.GenericViewSet):
    """`POST /instances/{id}/terminate/`: ending a node is orchestration's (the provider, billing, the
    agent's token, the job's reaction); fleet's `InstanceViewSet` serves the rest of `/instances/`."""

    serializer_class = InstanceSerializer
    permission_classes = [IsAuthenticated, UsersOnly]

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return fleet_selectors.instance_list(team_ids=team_ids)

    @extend_schema(request=TerminateSerializer, responses={
        200: InstanceSerializer,
        400: OpenApiResponse(description="A bad `reason` (named)."),
        401: OpenApiResponse(description="No or a bad token."),
        403: OpenApiResponse(description="Not an admin of the instance's team, or an agent token."),
        404: OpenApiResponse(description="Not one of your teams' instances."),
        409: OpenApiResponse(description="The instance already ended (`errors.state`)."),
        502: OpenApiResponse(description="The cloud provider refused or could not be reached; nothing changed."),
    })
    @action(detail=True, methods=["post"])
    def terminate(self, request: Request, pk: str | None = None) -> Response:
        """Terminate the instance now (team admins): the provider ends it, its billing closes, its
        agent token is revoked, and a job it served reacts as to any node leaving."""
        instance = self.get_object()
        if instance.team_id not in admin_team_ids_for_request(request):
            raise exceptions.PermissionDenied("only admins of the instance's team may terminate it")
        data = validate_or_400(TerminateSerializer(data=request.data or {}))
        reason = data.get("reason") or f"terminated by {request.user.username} through the API"
        try:
            services.instance_terminate(instance=instance, reason=reason)
        except ProviderError as exc:
            raise ProviderUnavailable(f"the provider did not terminate the instance: {exc}"[:300]) from None
        return Response(InstanceSerializer(self.get_queryset().get(pk=instance.pk)).data)
