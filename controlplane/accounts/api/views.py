"""Teams (read only) and API tokens (list, create, revoke)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts import selectors, services
from controlplane.accounts.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenFilter,
    ApiTokenSerializer,
    TeamFilter,
    TeamSerializer,
)
from controlplane.accounts.models import ApiToken, TokenKind
from controlplane.accounts.scoping import admin_team_ids_for_request
from controlplane.common.api import UsersOnly, ValidatedQueryFilter, resolve_team, validate_or_400
from controlplane.fleet.models import Instance


class TeamViewSet(viewsets.ReadOnlyModelViewSet):
    """The teams the requester belongs to (a user token sees only its own team)."""

    serializer_class = TeamSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [ValidatedQueryFilter]
    filter_serializer_class = TeamFilter

    def get_queryset(self) -> QuerySet:
        return selectors.team_list_for_request(self.request)


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """API tokens. Admins of a team see and manage all its tokens; members see their own.
    The plaintext key is returned once, by the create call."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [ValidatedQueryFilter]
    filter_serializer_class = ApiTokenFilter

    def get_queryset(self) -> QuerySet:
        return selectors.api_token_list_for_request(self.request)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = validate_or_400(ApiTokenCreateSerializer(data=request.data))
        team = resolve_team(request, data.get("team"))
        if team.pk not in admin_team_ids_for_request(request):
            raise exceptions.PermissionDenied(f"only admins of team {team.slug!r} may create its tokens")
        instance = None
        if data.get("instance") is not None:
            instance = Instance.objects.filter(pk=data["instance"], team=team).first()
            if instance is None:
                message = f"no instance {data['instance']} in team {team.slug!r}"
                raise exceptions.ValidationError({"instance": [message]})
        token, key = services.api_token_create(
            team=team,
            kind=data["kind"],
            name=data["name"],
            user=request.user if data["kind"] == TokenKind.USER else None,
            instance=instance,
            expires_at=data["expires_at"],
        )
        token.key = key  # only on this response object; the database holds the hash alone
        return Response(ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the token (the row stays, with `revoked_at`, for the audit trail)."""
        token: ApiToken = self.get_object()
        # Visible tokens are the requester's own or those of a team it administers: both may revoke.
        services.api_token_revoke(token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)
