"""Who may see and call what in the API: every object belongs to one team, and node agents are
told apart from users.

`TeamScopedViewSetMixin.get_queryset` filters by the teams the request may see, so another team's
object is simply not found (404), never forbidden (403). Node agents (`AgentPrincipal`) pass
`IsAuthenticated` too, so each view lists the actions an agent may call (`agent_actions`) and
narrows the queryset to the agent's own instance (`agent_scope`); `UsersOnly` refuses them outright.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import QuerySet
from rest_framework import exceptions, serializers
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from controlplane.accounts.models import ApiToken, Team
from controlplane.accounts.scoping import is_agent, request_token, team_ids_for_request

# --- Agents ----------------------------------------------------------------------------------------


class AgentActionsOnly(BasePermission):
    """Agents may call only the view actions listed in `view.agent_actions`; users pass through.

    What an allowed agent then sees is narrowed by the view's `agent_scope`, so another
    instance's objects still answer 404."""

    message = "node agent tokens may not use this endpoint"

    def has_permission(self, request: Request, view: Any) -> bool:
        if not is_agent(request):
            return True
        return getattr(view, "action", None) in getattr(view, "agent_actions", frozenset())


class UsersOnly(BasePermission):
    """Refuses node agents outright (for views with no agent use at all)."""

    message = "node agent tokens may not use this endpoint"

    def has_permission(self, request: Request, view: Any) -> bool:
        return not is_agent(request)


def agent_token(request: Request) -> ApiToken | None:
    """The agent token of the request, or None for users."""
    return request_token(request) if is_agent(request) else None


def resolve_team(request: Request, team_id: int | None, *, field: str = "team") -> Team:
    """The team a write goes to: `team_id` if the request may see it, else the request's only
    team. An unknown team and another team's id answer the same 400, so ids leak nothing."""
    visible = team_ids_for_request(request)
    if team_id is None:
        if len(visible) == 1:
            return Team.objects.get(pk=visible[0])
        raise exceptions.ValidationError({field: ["required: you belong to several teams (or none); name one"]})
    if team_id not in visible:
        raise exceptions.ValidationError({field: [f"no team {team_id} among your teams"]})
    return Team.objects.get(pk=team_id)


class TeamScopedViewSetMixin:
    """Base of every team-owned viewset. Subclasses implement `scoped_queryset(team_ids)` (usually
    a selector with its select/prefetch_related); the mixin passes the request's teams, filters
    by `team_lookup` once more as a guard, and narrows agents through `agent_scope`."""

    team_lookup: ClassVar[str] = "team_id"
    agent_actions: ClassVar[frozenset[str]] = frozenset()

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        """The viewset's objects of `team_ids`: every team-owned viewset defines it."""
        raise NotImplementedError(f"{type(self).__name__} must define scoped_queryset(team_ids)")

    def get_queryset(self) -> QuerySet:
        request = self.request  # type: ignore[attr-defined]
        team_ids = team_ids_for_request(request)
        queryset = self.scoped_queryset(team_ids).filter(**{f"{self.team_lookup}__in": team_ids})
        token = agent_token(request)
        if token is not None:
            queryset = self.agent_scope(queryset, token)
        return queryset

    def agent_scope(self, queryset: QuerySet, token: ApiToken) -> QuerySet:
        """What an agent may see among its team's objects: nothing unless a view says otherwise."""
        return queryset.none()

    def get_object(self) -> Any:
        """The scoped object named by the URL, or 404. Unlike DRF's, it does not run the filter
        backends: on nested lists (`/jobs/{id}/metrics/?since_step=`) they filter the children."""
        obj = get_object_or_404(self.get_queryset(), pk=self.kwargs["pk"])  # type: ignore[attr-defined]
        self.check_object_permissions(self.request, obj)  # type: ignore[attr-defined]
        return obj

    def paginated_response(self, queryset: QuerySet, serializer_class: type[serializers.BaseSerializer]) -> Any:
        """A paginated list of `queryset` (for nested lists such as /jobs/{id}/events/)."""
        page = self.paginate_queryset(queryset)  # type: ignore[attr-defined]
        return self.get_paginated_response(serializer_class(page, many=True).data)  # type: ignore[attr-defined]
