"""A team's outbound alert endpoints and inbound webhook credentials. Members of a team read them;
only its admins create, change, rotate and revoke. Secrets are answered once, by create and rotate,
and never listed. (The inbound webhook receivers themselves are plain Django views in
`controlplane/webhooks/views.py`.)"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.api.access import TeamScopedViewSetMixin, UsersOnly, resolve_team
from controlplane.accounts.models import Team
from controlplane.accounts.scoping import admin_team_ids_for_request
from controlplane.common.api import validate_or_400
from controlplane.common.errors import Conflict
from controlplane.common.filters import FilterBackend
from controlplane.webhooks import alerts, credentials
from controlplane.webhooks.api.filters import AlertEndpointFilter, WebhookCredentialFilter
from controlplane.webhooks.api.serializers import (
    AlertEndpointCreatedSerializer,
    AlertEndpointCreateSerializer,
    AlertEndpointSerializer,
    AlertEndpointUpdateSerializer,
    SecretRotateSerializer,
    WebhookCredentialCreatedSerializer,
    WebhookCredentialCreateSerializer,
    WebhookCredentialSerializer,
)
from controlplane.webhooks.models import AlertEndpoint, WebhookCredential


def _require_admin(request: Request, team_id: int, what: str) -> None:
    if team_id not in admin_team_ids_for_request(request):
        raise exceptions.PermissionDenied(f"only admins of the team may {what}")


class AlertEndpointViewSet(
    TeamScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """URLs a team's job status changes and budget thresholds are sent to, signed with Standard
    Webhooks. The signing secret is shown once, when the endpoint is created or its secret rotated."""

    serializer_class = AlertEndpointSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = AlertEndpointFilter

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return AlertEndpoint.objects.filter(team_id__in=team_ids).order_by("-created_at", "-id")

    @extend_schema(request=AlertEndpointCreateSerializer, responses={201: AlertEndpointCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = validate_or_400(AlertEndpointCreateSerializer(data=request.data))
        team: Team = resolve_team(request, data.get("team"))
        _require_admin(request, team.pk, "register alert endpoints")
        endpoint = alerts.alert_endpoint_create(team=team, url=data["url"], format=data["format"],
                                                events=data["events"])
        return Response(AlertEndpointCreatedSerializer(endpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=AlertEndpointUpdateSerializer, responses={200: AlertEndpointSerializer})
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        endpoint: AlertEndpoint = self.get_object()
        _require_admin(request, endpoint.team_id, "change alert endpoints")
        data = validate_or_400(AlertEndpointUpdateSerializer(data=request.data))
        endpoint = alerts.alert_endpoint_update(endpoint=endpoint, **data)
        return Response(AlertEndpointSerializer(endpoint).data)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Remove the endpoint and its delivery history."""
        endpoint: AlertEndpoint = self.get_object()
        _require_admin(request, endpoint.team_id, "remove alert endpoints")
        endpoint.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=SecretRotateSerializer, responses={200: AlertEndpointCreatedSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str | None = None) -> Response:
        """A new signing secret, shown once. Deliveries carry a second signature made with the old
        secret for `grace_hours` (default 24), so the receiver can switch at its own pace."""
        endpoint: AlertEndpoint = self.get_object()
        _require_admin(request, endpoint.team_id, "rotate alert secrets")
        data = validate_or_400(SecretRotateSerializer(data=request.data or {}))
        endpoint = alerts.alert_endpoint_rotate_secret(endpoint=endpoint, grace=timedelta(hours=data["grace_hours"]))
        return Response(AlertEndpointCreatedSerializer(endpoint).data)


class WebhookCredentialViewSet(
    TeamScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """How a team's inbound webhooks authenticate (`/api/v1/webhooks/<source>/<team>/`). The secret
    is shown once, when the credential is created or rotated; lists never show secrets or hashes."""

    serializer_class = WebhookCredentialSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = WebhookCredentialFilter

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return WebhookCredential.objects.filter(team_id__in=team_ids).order_by("-created_at", "-id")

    @extend_schema(request=WebhookCredentialCreateSerializer, responses={201: WebhookCredentialCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = validate_or_400(WebhookCredentialCreateSerializer(data=request.data))
        team: Team = resolve_team(request, data.get("team"))
        _require_admin(request, team.pk, "create webhook credentials")
        cred, plain = credentials.credential_create(
            team=team, source=data["source"], scheme=data["scheme"], name=data["name"],
            header_name=data["header_name"], username=data["username"], secret=data.get("secret"),
            topic_arn=data["topic_arn"], config=data.get("oidc"),
        )
        cred.secret = plain  # only on this response object
        return Response(WebhookCredentialCreatedSerializer(cred).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=SecretRotateSerializer, responses={201: WebhookCredentialCreatedSerializer})
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, pk: str | None = None) -> Response:
        """A successor with the same settings and a new secret (shown once); this credential stays
        valid for `grace_hours` (default 24) so the sender can switch without losing a notice."""
        cred: WebhookCredential = self.get_object()
        _require_admin(request, cred.team_id, "rotate webhook credentials")
        if not credentials.credential_is_active(cred):
            raise Conflict("this credential is revoked or expired; create a new one", field="id")
        data = validate_or_400(SecretRotateSerializer(data=request.data or {}))
        new, plain = credentials.credential_rotate(credential=cred, overlap=timedelta(hours=data["grace_hours"]))
        new.secret = plain
        return Response(WebhookCredentialCreatedSerializer(new).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the credential at once (the row stays, with `revoked_at`)."""
        cred: WebhookCredential = self.get_object()
        _require_admin(request, cred.team_id, "revoke webhook credentials")
        credentials.credential_revoke(credential=cred)
        return Response(status=status.HTTP_204_NO_CONTENT)
