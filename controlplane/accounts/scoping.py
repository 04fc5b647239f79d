"""Team scoping: which teams a request may see. Every API view and dashboard page filters by it,
and answers 404 (never 403) for another team's objects."""

from __future__ import annotations

from typing import Any

from controlplane.accounts.models import ApiToken, Membership, Role, TokenKind


def request_token(request: Any) -> ApiToken | None:
    """The ApiToken a request authenticated with, if any."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiToken) else None


def is_agent(request: Any) -> bool:
    token = request_token(request)
    return token is not None and token.kind == TokenKind.AGENT


def team_ids_for_request(request: Any) -> list[int]:
    """Team ids visible to the request. A user token is limited to its own team even when the user
    belongs to several; session users see all their teams; agents see their token's team."""
    token = request_token(request)
    if token is not None and token.kind == TokenKind.AGENT:
        return [token.team_id]
    user = getattr(request, "user", None)
    if token is None and (user is None or not user.is_authenticated):
        return []
    # Cache per request: scoping is asked several times in one view.
    cached = getattr(request, "_spotpipe_team_ids", None)
    if cached is None:
        if token is not None:
            # A user who left the team keeps no access through an old token.
            still_member = Membership.objects.filter(team_id=token.team_id, user_id=token.user_id).exists()
            cached = [token.team_id] if still_member else []
        else:
            cached = list(Membership.objects.filter(user=user).values_list("team_id", flat=True))
        request._spotpipe_team_ids = cached
    return cached


def admin_team_ids_for_request(request: Any) -> list[int]:
    """Team ids where the request's user is an admin (agents are never admins)."""
    if is_agent(request):
        return []
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return []
    visible = set(team_ids_for_request(request))
    ids = Membership.objects.filter(user=user, role=Role.ADMIN).values_list("team_id", flat=True)
    return [i for i in ids if i in visible]
