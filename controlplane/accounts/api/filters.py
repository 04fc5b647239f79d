"""Query filters of `/teams/` and `/tokens/`."""

from __future__ import annotations

from django_filters import rest_framework as filters

from controlplane.accounts.models import ApiToken, Team, TokenKind
from controlplane.common.filters import OrderingFilter, id_filter, live_filter, search_filter


class ApiTokenFilter(filters.FilterSet):
    team = id_filter("team_id")
    kind = filters.ChoiceFilter(choices=TokenKind.choices)
    active = live_filter()
    search = search_filter("name", "prefix")
    ordering = OrderingFilter("created_at", "last_used_at", "name")

    class Meta:
        model = ApiToken
        fields: list[str] = []


class TeamFilter(filters.FilterSet):
    search = search_filter("name", "slug")
    ordering = OrderingFilter("name", "created_at")

    class Meta:
        model = Team
        fields: list[str] = []
