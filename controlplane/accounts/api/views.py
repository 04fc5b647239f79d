"""Teams (read; staff create a team with its first admin), their members (admins manage them) and
API tokens (list, create, revoke)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts import selectors, services
from controlplane.accounts.api.access import UsersOnly, resolve_team
from controlplane.accounts.api.filters import ApiTokenFilter, TeamFilter
from controlplane.accounts.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    MembershipCreateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    TeamCreatedSerializer,
    TeamCreateSerializer,
    TeamSerializer,
)
from controlplane.accounts.models import ApiToken, Membership, Team, TokenKind
from controlplane.accounts.scoping import admin_team_ids_for_request
from controlplane.common.api import validate_or_400
from controlplane.common.errors import Conflict
from controlplane.common.filters import FilterBackend

ERRORS = {
    401: OpenApiResponse(description="No or a bad token."),
    403: OpenApiResponse(description="Not allowed to the requester's role (or an agent token)."),
    404: OpenApiResponse(description="Not one of your teams, or no such member."),
}


def _require_team_admin(request: Request, team: Team) -> None:
    if team.pk not in admin_team_ids_for_request(request):
        raise exceptions.PermissionDenied(f"only admins of team {team.slug!r} may manage its members")


class TeamViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """The teams the requester belongs to (a user token sees only its own team). Staff create
    teams; a team's members are listed to its members and managed by its admins."""

    serializer_class = TeamSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = TeamFilter

    def get_queryset(self) -> QuerySet:
        return selectors.team_list_for_request(self.request)

    @extend_schema(request=TeamCreateSerializer, responses={
        201: TeamCreatedSerializer, 400: OpenApiResponse(description="A bad field, named in `errors`."),
        401: ERRORS[401], 403: OpenApiResponse(description="Not a staff user."),
        409: OpenApiResponse(description="A team with this slug exists (`errors.slug`)."),
    })
    def create(self, request: Request) -> Response:
        """Create a team with its first admin (an existing user of that username, else a new one
        without a usable password) and that admin's first API token, whose key is shown once.
        Staff users only (`is_staff`)."""
        if not getattr(request.user, "is_staff", False):
            raise exceptions.PermissionDenied("only staff users may create teams")
        data = validate_or_400(TeamCreateSerializer(data=request.data))
        team, user, created, token, key = services.team_create_with_admin(
            name=data["name"], slug=data.get("slug"), admin_username=data["admin"],
            admin_email=data["admin_email"], token_name=data["token_name"],
        )
        team = selectors.team_list_for_request(request).filter(pk=team.pk).first() or team
        team.my_role = getattr(team, "my_role", None)
        team.member_count = Membership.objects.filter(team=team).count()
        token.key = key
        return Response({
            "team": TeamSerializer(team).data,
            "admin": {"id": user.pk, "username": user.username, "created": created},
            "token": ApiTokenCreatedSerializer(token).data,
        }, status=status.HTTP_201_CREATED)

    def _team(self) -> Team:
        return self.get_object()

    @extend_schema(methods=["GET"], responses={200: MembershipSerializer(many=True), **ERRORS}, filters=False)
    @extend_schema(methods=["POST"], request=MembershipCreateSerializer, responses={
        201: MembershipSerializer, 400: OpenApiResponse(description="No such user, or a bad role (named)."),
        409: OpenApiResponse(description="Already a member (change the role with PATCH)."), **ERRORS})
    @action(detail=True, methods=["get", "post"], filter_backends=[], pagination_class=None)
    def members(self, request: Request, pk: str | None = None) -> Response:
        """GET: the team's members and roles (any member). POST: add an existing user by username
        (team admins)."""
        team = self._team()
        if request.method == "GET":
            rows = Membership.objects.filter(team=team).select_related("user").order_by("user__username", "id")
            return Response(MembershipSerializer(rows, many=True).data)
        _require_team_admin(request, team)
        data = validate_or_400(MembershipCreateSerializer(data=request.data))
        user = get_user_model().objects.filter(username=data["username"]).first()
        if user is None:
            raise exceptions.ValidationError({"username": [f"no user {data['username']!r}"]})
        if Membership.objects.filter(team=team, user=user).exists():
            raise Conflict(f"{user.username} is already a member of {team.slug}; PATCH to change the role",
                           field="username")
        membership = services.membership_add(team=team, user=user, role=data["role"])
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(methods=["PATCH"], request=MembershipUpdateSerializer, responses={
        200: MembershipSerializer, 400: OpenApiResponse(description="A bad role."),
        409: OpenApiResponse(description="The team's last admin cannot become a member."), **ERRORS})
    @extend_schema(methods=["DELETE"], request=None, responses={
        204: None, 409: OpenApiResponse(description="The team's last admin cannot be removed."), **ERRORS})
    @action(detail=True, methods=["patch", "delete"], url_path=r"members/(?P<user_id>[0-9]{1,18})",
            filter_backends=[], pagination_class=None)
    def member(self, request: Request, pk: str | None = None, user_id: str | None = None) -> Response:
        """PATCH: change a member's role. DELETE: remove the member and revoke their tokens of
        this team. Team admins only; the last admin stays."""
        team = self._team()
        _require_team_admin(request, team)
        membership = get_object_or_404(Membership.objects.select_related("user"), team=team, user_id=int(user_id))
        if request.method == "DELETE":
            services.membership_remove(team=team, user=membership.user)
            return Response(status=status.HTTP_204_NO_CONTENT)
        # PATCH: what is left out stays as it is (the schema's PatchedMembershipUpdate).
        data = validate_or_400(MembershipUpdateSerializer(data=request.data, partial=True))
        if "role" in data:
            membership = services.membership_add(team=team, user=membership.user, role=data["role"])
        return Response(MembershipSerializer(membership).data)


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """API tokens. Admins of a team see and manage all its tokens; members see their own.
    The plaintext key is returned once, by the create call."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = ApiTokenFilter

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
            instance = team.instances.filter(pk=data["instance"]).first()
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

    @extend_schema(request=None, responses={
        201: ApiTokenCreatedSerializer,
        400: OpenApiResponse(description="An agent token (agents rotate their own: POST /agents/token/)."),
        409: OpenApiResponse(description="The token is revoked or expired."), **ERRORS,
        403: OpenApiResponse(description="Another user's token, or an agent token.")})
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, pk: str | None = None) -> Response:
        """Replace this user token with a new one (same team, user, name and expiry; the key shown
        once) and revoke it at once. The token's own user only: an admin would otherwise get a key
        that acts as someone else (admins revoke others' tokens with DELETE)."""
        token: ApiToken = self.get_object()
        if token.kind == TokenKind.USER and token.user_id != request.user.pk:
            raise exceptions.PermissionDenied("only the token's own user may rotate it; admins may revoke it")
        new, key = services.user_token_rotate(token=token)
        new.key = key
        return Response(ApiTokenCreatedSerializer(new).data, status=status.HTTP_201_CREATED)
