"""Shared API building blocks: team-scoped viewsets, agent access rules and error flattening (the
lists' query filters are django-filter FilterSets: common/filters.py).

Every API object belongs to one team. `TeamScopedViewSetMixin.get_queryset` filters by the teams
the request may see, so another team's object is simply not found (404), never forbidden (403).
Node agents (`AgentPrincipal`) pass `IsAuthenticated` too, so each view lists the actions an agent
may call (`agent_actions`) and narrows the queryset to the agent's own instance (`agent_scope`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import QuerySet
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent, build_choice_field
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from controlplane.accounts.models import ApiToken, Team
from controlplane.accounts.scoping import is_agent, request_token, team_ids_for_request


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Turn DRF's nested error structure into `{"samples[3].loss": ["..."]}` so every message
    names the exact field, however deep it sits."""
    flat: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int):  # DRF reports a ListSerializer's errors by item index
                name = f"{prefix}[{key}]"
            elif not prefix:
                name = str(key)
            else:
                name = prefix if key == "non_field_errors" else f"{prefix}.{key}"
            for sub, messages in flatten_errors(value, name).items():
                flat.setdefault(sub, []).extend(messages)
    elif isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            if detail:
                flat[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                for sub, messages in flatten_errors(item, f"{prefix}[{index}]").items():
                    flat.setdefault(sub, []).extend(messages)
    else:
        flat[prefix or "non_field_errors"] = [str(detail)]
    return flat


def validate_or_400(serializer: serializers.BaseSerializer) -> Any:
    """Validate and return `validated_data`, raising a 400 whose field names are flattened paths."""
    if not serializer.is_valid():
        raise exceptions.ValidationError(flatten_errors(serializer.errors))
    return serializer.validated_data


def validated_query(serializer_class: type[serializers.Serializer], request: Request) -> Any:
    """The query parameters of a report or computation (not a list's filters: those are FilterSets,
    common/filters.py) validated by `serializer_class`; parameters it does not know are ignored."""
    known = set(serializer_class().fields)
    return validate_or_400(serializer_class(data={k: request.query_params.get(k) for k in request.query_params
                                                  if k in known}))


class NamedChoiceField(serializers.ChoiceField):
    """A ChoiceField documented as its own named enum component (`enum_name`). drf-spectacular
    otherwise names enums after the field, and two models with a `kind` field of different choices
    collide (a schema warning)."""

    def __init__(self, *args: Any, enum_name: str, **kwargs: Any) -> None:
        self.enum_name = enum_name
        super().__init__(*args, **kwargs)


class NamedChoiceFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "controlplane.common.api.NamedChoiceField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict:
        field = self.target
        schema = build_choice_field(field)
        schema.pop("x-spec-enum-id", None)  # keeps the enum post-processing hook away from it
        if None in schema["enum"]:
            schema["enum"].remove(None)  # nullability is the field's, added around the reference
        component = ResolvedComponent(
            name=field.enum_name, type=ResolvedComponent.SCHEMA, object=field.enum_name, schema=schema
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


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
        raise NotImplementedError

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


@extend_schema_field({"type": "object", "additionalProperties": {}})
class JSONObjectField(serializers.JSONField):
    """A JSON object (not null, a list or a scalar), documented as one."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value
