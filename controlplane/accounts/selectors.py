"""Reads on teams and tokens, scoped to what a request may see."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from controlplane.accounts.models import ApiToken, Membership, Team
from controlplane.accounts.scoping import admin_team_ids_for_request, team_ids_for_request


def team_list_for_request(request: Any) -> QuerySet[Team]:
    """The request's teams, each annotated with the requester's `my_role` and `member_count`."""
    role = Membership.objects.filter(team_id=OuterRef("pk"), user_id=request.user.pk).values("role")[:1]
    return (
        Team.objects.filter(pk__in=team_ids_for_request(request))
        .annotate(my_role=Subquery(role), member_count=Count("memberships", distinct=True))
        .order_by("name", "id")
    )


def api_token_list_for_request(request: Any) -> QuerySet[ApiToken]:
    """Every token of the teams where the requester is an admin, plus the requester's own user
    tokens in the teams it may see. Newest first."""
    visible = Q(team_id__in=admin_team_ids_for_request(request)) | Q(
        user_id=request.user.pk, team_id__in=team_ids_for_request(request)
    )
    return ApiToken.objects.filter(visible).select_related("team", "user", "instance").order_by("-created_at", "-id")


def agent_token_live(*, instance_id: int) -> ApiToken | None:
    """The instance's live agent token (there is one at most), or None."""
    return ApiToken.objects.filter(kind="agent", instance_id=instance_id, revoked_at__isnull=True).first()
