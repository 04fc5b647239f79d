"""The team page: members and roles, API tokens and outbound alert URLs. Every member sees the
team; only its admins change it (a member's POST is refused with 403, another team answers 404),
except that every user rotates their own API tokens (and only their own, as in the API).
The writes go through the same services as the API (`accounts.services`, `webhooks.alerts`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.models import ApiToken, Membership, Role, Team, TokenKind
from controlplane.accounts.services import (
    api_token_create,
    api_token_revoke,
    membership_add,
    membership_remove,
    user_token_rotate,
)
from controlplane.common.errors import DomainError
from controlplane.jobs.admission import team_quota_view
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertEndpoint, AlertFormat
from frontend.access import admin_team_ids, visible_team_ids
from frontend.spend import month_so_far
from runtime.storable import unstorable


def _team(request: HttpRequest, slug: str) -> Team:
    return get_object_or_404(Team, slug=slug, pk__in=visible_team_ids(request))


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    """Go straight to the user's team when there is one; list them otherwise."""
    teams = list(Team.objects.filter(pk__in=visible_team_ids(request)).order_by("name"))
    if len(teams) == 1:
        return redirect("frontend:team", slug=teams[0].slug)
    return render(request, "frontend/team_list.html", {"page": "team", "teams": teams})


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    return _page(request, _team(request, slug))


def _page(request: HttpRequest, team: Team, *, revealed: dict[str, str] | None = None) -> HttpResponse:
    is_admin = team.pk in admin_team_ids(request)
    tokens = ApiToken.objects.filter(team=team).select_related("user", "instance").order_by("-created_at", "-id")
    if not is_admin:
        tokens = tokens.filter(user=request.user)
    return render(request, "frontend/team.html", {
        "page": "team", "team": team, "is_admin": is_admin, "revealed": revealed,
        "members": Membership.objects.filter(team=team).select_related("user").order_by("user__username"),
        "tokens": tokens[:200], "alerts": AlertEndpoint.objects.filter(team=team).order_by("-created_at", "-id"),
        "roles": Role.choices, "formats": AlertFormat.choices, "spend_window": month_so_far(),
        "quota": team_quota_view(team_id=team.pk),
    })


def _reveal(request: HttpRequest, team: Team, *, label: str, secret: str) -> HttpResponse:
    """The team page with a new secret shown once, in this response only. Never through Django's
    messages (their default storage is a cookie, then the session) nor a log line."""
    response = _page(request, team, revealed={"label": label, "secret": secret})
    response["Cache-Control"] = "no-store"  # no copy of the secret in a browser or proxy cache
    return response


def _admin_post(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A POST that changes the team: signed in, POST only, and the team's admins only (403 for its
    other members, 404 for another team); the view gets the team instead of its slug."""

    @login_required
    @require_POST
    @functools.wraps(view)
    def checked(request: HttpRequest, slug: str, **kwargs: Any) -> HttpResponse:
        team = _team(request, slug)
        if team.pk not in admin_team_ids(request):
            return HttpResponseForbidden("only the team's admins can change it")
        return view(request, team, **kwargs)

    return checked


def _done(request: HttpRequest, team: Team, error: DomainError | None, success: str) -> HttpResponse:
    if error is not None:
        messages.error(request, error.message)
    else:
        messages.success(request, success)
    return redirect("frontend:team", slug=team.slug)


@_admin_post
def member_add(request: HttpRequest, team: Team) -> HttpResponse:
    username = request.POST.get("username", "").strip()
    # A name no store accepts is no user's (PostgreSQL would refuse the lookup itself: a 500).
    user = None if unstorable(username) else get_user_model().objects.filter(username=username).first()
    if user is None:
        return _done(request, team, DomainError(f"no user named {username!r}", field="username"), "")
    try:
        membership_add(team=team, user=user, role=request.POST.get("role", Role.MEMBER))
    except DomainError as error:
        return _done(request, team, error, "")
    return _done(request, team, None, f"{username} is now {request.POST.get('role', Role.MEMBER)} of {team.name}.")


def _member_change(request: HttpRequest, team: Team, user_id: int, change: Callable[[Any], str]) -> HttpResponse:
    """An admin's change to one member of the team: `change(user)` makes it and returns the success
    message; a DomainError it raises (the team's last admin) becomes the error message."""
    membership = get_object_or_404(Membership.objects.select_related("user"), team=team, user_id=user_id)
    try:
        success = change(membership.user)
    except DomainError as error:
        return _done(request, team, error, "")
    return _done(request, team, None, success)


@_admin_post
def member_remove(request: HttpRequest, team: Team, user_id: int) -> HttpResponse:
    def remove(user: Any) -> str:
        membership_remove(team=team, user=user)
        return f"{user.username} removed; their tokens of this team are revoked."

    return _member_change(request, team, user_id, remove)


@_admin_post
def member_role(request: HttpRequest, team: Team, user_id: int) -> HttpResponse:
    """Change a member's role (the API's PATCH of a member); the team's last admin stays one."""
    role = request.POST.get("role", "")

    def set_role(user: Any) -> str:
        membership_add(team=team, user=user, role=role)
        return f"{user.username} is now {role} of {team.name}."

    return _member_change(request, team, user_id, set_role)


@_admin_post
def token_create(request: HttpRequest, team: Team) -> HttpResponse:
    """A user token for the requesting admin; the key is shown once, in this response's page."""
    try:
        token, key = api_token_create(team=team, kind=TokenKind.USER, user=request.user,
                                      name=request.POST.get("name", "")[:100])
    except DomainError as error:
        return _done(request, team, error, "")
    return _reveal(request, team, label=f"Token {token.prefix}… created. Copy the key now, it is not shown again:",
                   secret=key)


@_admin_post
def token_revoke(request: HttpRequest, team: Team, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, team=team)
    api_token_revoke(token=token)
    return _done(request, team, None, f"Token {token.prefix}… revoked.")


@_admin_post
def alert_add(request: HttpRequest, team: Team) -> HttpResponse:
    url = request.POST.get("url", "").strip()
    try:
        endpoint = alert_endpoint_create(team=team, url=url, format=request.POST.get("format", AlertFormat.GENERIC))
    except DomainError as error:
        return _done(request, team, error, "")
    # The URL may hold a secret of its own (Slack's do): it stays out of the messages too.
    return _reveal(request, team, label=f"Alerts will be sent to {endpoint.url}. Signing secret (shown once):",
                   secret=endpoint.signing_secret)


@login_required
@require_POST
def token_rotate(request: HttpRequest, slug: str, token_id: int) -> HttpResponse:
    """Replace one's own token with a new one (same name and expiry) and revoke it; the new key is
    shown once, in this response's page. Only the token's own user: an admin would otherwise get a
    key that acts as someone else (admins revoke others' tokens)."""
    team = _team(request, slug)
    token = get_object_or_404(ApiToken, pk=token_id, team=team)
    if token.kind == TokenKind.USER and token.user_id != request.user.pk:
        return HttpResponseForbidden("only the token's own user may rotate it; admins may revoke it")
    try:
        new, key = user_token_rotate(token=token)
    except DomainError as error:
        return _done(request, team, error, "")
    return _reveal(request, team, label=f"Token {token.prefix}… revoked and replaced by {new.prefix}…. Copy the "
                   "new key now, it is not shown again:", secret=key)
