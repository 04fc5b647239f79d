"""Writes on teams, memberships and API tokens."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from controlplane.accounts.authentication import generate_key, hash_key
from controlplane.accounts.models import ApiToken, Membership, Role, Team, TokenKind
from controlplane.common.errors import Conflict, DomainError
from controlplane.tunables import tunable
from runtime.storable import unstorable

# An agent token lives a day unless SPOTPIPE_AGENT_TOKEN_TTL_S says otherwise; the agent rotates it
# at half its life (POST /api/v1/agents/token/), so only a node cut off that long loses it.


def agent_token_ttl() -> timedelta:
    """How long an agent token is valid (setting SPOTPIPE_AGENT_TOKEN_TTL_S, seconds)."""
    return timedelta(seconds=float(tunable("SPOTPIPE_AGENT_TOKEN_TTL_S")))


def user_token_lifetime() -> timedelta:
    """The longest a user token lives, and how long one created without an expiry does (setting
    SPOTPIPE_USER_TOKEN_MAX_DAYS): a forgotten key in a CI system stops working on its own."""
    return timedelta(days=float(tunable("SPOTPIPE_USER_TOKEN_MAX_DAYS")))


@transaction.atomic
def team_create(*, name: str, slug: str | None = None, admin: Any | None = None) -> Team:
    """Create a team (slug from the name unless given); `admin`, when given, becomes its admin."""
    name = name.strip()
    if not name:
        raise DomainError("team name must not be empty", field="name")
    for field, value in (("name", name), ("slug", slug or "")):
        if what := unstorable(value):
            raise DomainError(f"{field} contains {what}", field=field)
    slug = slugify(slug or name)
    if not slug:
        raise DomainError(f"cannot derive a slug from {name!r}; give one", field="slug")
    # Checked after slugify: a slug derived from a long name is as long as the name.
    longest = Team._meta.get_field("slug").max_length
    if len(slug) > longest:
        raise DomainError(f"the slug {slug[:20]!r}... is {len(slug)} characters, at most {longest}; give a shorter "
                          "one", field="slug")
    if Team.objects.filter(slug=slug).exists():
        raise Conflict(f"a team with slug {slug!r} already exists", field="slug")
    team = Team.objects.create(name=name, slug=slug)
    if admin is not None:
        Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    return team


@transaction.atomic
def membership_add(*, team: Team, user: Any, role: str = Role.MEMBER) -> Membership:
    """Add `user` to `team` with `role`, or change the role of an existing membership. Refuses to
    make the team's last admin a member (the team would have no one to manage it)."""
    if role not in Role.values:
        raise DomainError(f"unknown role {role!r}; expected one of {', '.join(Role.values)}", field="role")
    membership, created = Membership.objects.select_for_update().get_or_create(
        team=team, user=user, defaults={"role": role}
    )
    if not created and membership.role != role:
        if membership.role == Role.ADMIN:
            _require_another_admin(team=team, membership=membership)
        membership.role = role
        membership.save(update_fields=["role", "updated_at"])
    return membership


def _require_another_admin(*, team: Team, membership: Membership) -> None:
    # Lock the team's admin rows: two admins demoting each other at once cannot both pass.
    admins = list(Membership.objects.select_for_update().filter(team=team, role=Role.ADMIN)
                  .exclude(pk=membership.pk).values_list("pk", flat=True))
    if not admins:
        raise Conflict(f"{membership.user} is the last admin of {team}; add another admin first", field="role")


def _username_checked(username: str) -> str:
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError

    username = (username or "").strip()
    field = get_user_model()._meta.get_field("username")
    if not username:
        raise DomainError("a username is required", field="admin")
    try:
        field.run_validators(username)
    except ValidationError as exc:
        raise DomainError("; ".join(exc.messages), field="admin") from exc
    if len(username) > field.max_length:
        raise DomainError(f"at most {field.max_length} characters", field="admin")
    return username


@transaction.atomic
def team_create_with_admin(
    *, name: str, admin_username: str, slug: str | None = None, admin_email: str = "", token_name: str = "first token"
) -> tuple[Team, Any, bool, ApiToken, str]:
    """Create a team with its first admin and that admin's first API token, all or nothing. The
    admin is an existing user of that username, else a new one without a usable password (it
    signs in with the token, or an operator sets a password). Returns the team, the user, whether
    the user was created, the token and its plaintext key (shown once)."""
    from django.contrib.auth import get_user_model

    username = _username_checked(admin_username)
    if admin_email:
        from django.core.exceptions import ValidationError
        from django.core.validators import validate_email

        try:
            validate_email(admin_email)
        except ValidationError as exc:
            raise DomainError("; ".join(exc.messages), field="admin_email") from exc
    if len(name or "") > Team._meta.get_field("name").max_length:
        raise DomainError(f"at most {Team._meta.get_field('name').max_length} characters", field="name")
    if slug is not None and len(slug) > Team._meta.get_field("slug").max_length:
        raise DomainError(f"at most {Team._meta.get_field('slug').max_length} characters", field="slug")
    users = get_user_model()
    user = users.objects.filter(username=username).first()
    created = user is None
    if created:
        user = users(username=username, email=admin_email or "")
        user.set_unusable_password()
        user.save()
    team = team_create(name=name, slug=slug, admin=user)
    token, key = api_token_create(team=team, kind=TokenKind.USER, name=token_name[:100], user=user)
    return team, user, created, token, key


@transaction.atomic
def membership_remove(*, team: Team, user: Any) -> None:
    """Remove `user` from `team` and revoke the user's tokens of that team (a user who left keeps
    no access). Refuses to remove the team's last admin."""
    membership = Membership.objects.select_for_update().filter(team=team, user=user).first()
    if membership is None:
        raise DomainError(f"{user} is not a member of {team}", field="user")
    if membership.role == Role.ADMIN:
        try:
            _require_another_admin(team=team, membership=membership)
        except Conflict as exc:
            raise Conflict(exc.message, field="user") from None
    membership.delete()
    ApiToken.objects.filter(team=team, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())


@transaction.atomic
def api_token_create(
    *,
    team: Team,
    kind: str = TokenKind.USER,
    name: str = "",
    user: Any | None = None,
    instance: Any | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its plaintext key, which is never stored and cannot be
    shown again. User tokens need a `user` who is a member of `team`; agent tokens need a live
    `instance` of `team`, expire within `agent_token_ttl()`, and replace (revoke) the instance's
    previous agent token: an instance has one live agent token at most."""
    if kind == TokenKind.USER:
        if user is None:
            raise DomainError("a user token needs a user", field="user")
        if instance is not None:
            raise DomainError("a user token cannot be bound to an instance", field="instance")
        if not Membership.objects.filter(team=team, user=user).exists():
            raise DomainError(f"{user} is not a member of team {team}", field="user")
        lifetime = user_token_lifetime()
        if expires_at is None:
            expires_at = timezone.now() + lifetime
        elif expires_at > timezone.now() + lifetime:
            raise DomainError(f"expires_at is at most {lifetime.days} days from now (SPOTPIPE_USER_TOKEN_MAX_DAYS); "
                              "without it a token lives that long", field="expires_at")
    elif kind == TokenKind.AGENT:
        if instance is None:
            raise DomainError("an agent token needs an instance", field="instance")
        if user is not None:
            raise DomainError("an agent token cannot act as a user", field="user")
        if instance.team_id != team.pk:
            raise DomainError(f"instance {instance.pk} does not belong to team {team}", field="instance")
        # The instance's row lock serialises concurrent enrolments, so exactly one token stays live.
        # `type(instance)`: accounts sits below fleet and reaches its model through the instance.
        locked = type(instance).objects.select_for_update().only("state").get(pk=instance.pk)
        if locked.ended:
            raise Conflict(f"instance {instance.pk} is {locked.state}; an ended instance gets no agent token",
                           field="instance")
        limit = timezone.now() + agent_token_ttl()
        expires_at = limit if expires_at is None else min(expires_at, limit)
        agent_tokens_revoke(instance_ids=[instance.pk])
    else:
        raise DomainError(f"unknown token kind {kind!r}; expected one of {', '.join(TokenKind.values)}", field="kind")
    if expires_at is not None and expires_at <= timezone.now():
        raise DomainError("expires_at must be in the future", field="expires_at")
    if what := unstorable(name):
        raise DomainError(f"name contains {what}", field="name")
    # A collision of 256-bit random keys would be a broken RNG; retry once rather than fail.
    for _ in range(2):
        key = generate_key()
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(
                    team=team, user=user, instance=instance, kind=kind, name=name,
                    prefix=key[:12], key_hash=hash_key(key), expires_at=expires_at,
                )
            return token, key
        except IntegrityError:
            continue
    raise RuntimeError("could not generate a unique API key")


@transaction.atomic
def api_token_revoke(*, token: ApiToken, at: datetime | None = None) -> ApiToken:
    """Revoke `token` now. Revoking twice keeps the first revocation time."""
    locked = ApiToken.objects.select_for_update().get(pk=token.pk)
    if locked.revoked_at is None:
        locked.revoked_at = at or timezone.now()
        locked.save(update_fields=["revoked_at", "updated_at"])
    token.revoked_at = locked.revoked_at
    return token


def agent_tokens_revoke(*, instance_ids: Iterable[int], at: datetime | None = None) -> int:
    """Revoke the live agent tokens of these instances (they ended, or a new token replaces the
    old one). Returns how many were revoked."""
    ids = list(instance_ids)
    if not ids:
        return 0
    return ApiToken.objects.filter(
        kind=TokenKind.AGENT, instance_id__in=ids, revoked_at__isnull=True
    ).update(revoked_at=at or timezone.now())


@transaction.atomic
def agent_token_rotate(*, token: ApiToken) -> tuple[ApiToken, str]:
    """Replace a live agent token with a new one for the same instance (the old one is revoked at
    once). Returns the new token and its plaintext key."""
    if token.kind != TokenKind.AGENT or token.instance_id is None:
        raise DomainError("only an agent token can be rotated here", field="token")
    locked = ApiToken.objects.select_for_update().get(pk=token.pk)  # no join: FOR UPDATE refuses nullable sides
    now = timezone.now()
    if locked.revoked_at is not None or (locked.expires_at is not None and locked.expires_at <= now):
        raise Conflict("the token was revoked or expired meanwhile; enrol again", field="token")
    return api_token_create(team=locked.team, kind=TokenKind.AGENT, name=locked.name, instance=locked.instance)


@transaction.atomic
def user_token_rotate(*, token: ApiToken) -> tuple[ApiToken, str]:
    """Replace a live user token with a new one of the same team, user, name and expiry; the old
    one is revoked in the same transaction. Returns the new token and its plaintext key (shown once)."""
    if token.kind != TokenKind.USER:
        raise DomainError("agent tokens rotate themselves (POST /api/v1/agents/token/)", field="token")
    locked = ApiToken.objects.select_for_update().get(pk=token.pk)
    now = timezone.now()
    if locked.revoked_at is not None or (locked.expires_at is not None and locked.expires_at <= now):
        raise Conflict("the token is revoked or expired; create a new one", field="token")
    new, key = api_token_create(team=locked.team, kind=TokenKind.USER, name=locked.name, user=locked.user,
                                expires_at=locked.expires_at)
    locked.revoked_at = now
    locked.save(update_fields=["revoked_at", "updated_at"])
    return new, key
