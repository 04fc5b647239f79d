"""Bearer-token authentication for users and node agents (`Authorization: Token <key>` or
`Authorization: Bearer <key>`). Only a SHA-256 of each key is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from controlplane.accounts.models import ApiToken, TokenKind

KEY_PREFIX = "sp_"
# A token's `last_used_at` is touched at most this often: a write per request would cost more than auth.
LAST_USED_EVERY_S = 60


def hash_key(key: str) -> str:
    """The stored form of a key."""
    return hashlib.sha256(key.encode()).hexdigest()


def token_expired(expires_at: datetime | None, now: datetime) -> bool:
    """Whether a token with this `expires_at` has expired at `now`."""
    return expires_at is not None and expires_at <= now


def last_used_due(last_used_at: datetime | None, now: datetime) -> bool:
    """Whether a token's `last_used_at` is old enough to be touched again."""
    return last_used_at is None or (now - last_used_at).total_seconds() > LAST_USED_EVERY_S


def generate_key() -> str:
    """A new random key; shown to its owner once and never stored in clear."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(eq=False)
class AgentPrincipal(AnonymousUser):
    """`request.user` for an agent token: authenticated, but not a user; it may act only for its
    own instance within its team."""

    token: ApiToken = field(default=None)  # type: ignore[assignment]

    @property
    def is_authenticated(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_anonymous(self) -> bool:  # type: ignore[override]
        return False

    @property
    def team_id(self) -> int:
        return self.token.team_id

    @property
    def instance_id(self) -> int | None:
        return self.token.instance_id

    def __str__(self) -> str:
        return f"agent for instance {self.instance_id}"


class ApiTokenAuthentication(BaseAuthentication):
    """Authenticates `Token`/`Bearer` keys against ApiToken rows (not revoked, not expired)."""

    keywords = (b"token", b"bearer")

    def authenticate(self, request: Request) -> tuple[object, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <key>'")
        try:
            key = parts[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("token contains invalid characters") from exc
        token = (
            ApiToken.objects.select_related("user", "team")
            .filter(key_hash=hash_key(key), revoked_at__isnull=True)
            .first()
        )
        now = timezone.now()
        if token is None or token_expired(token.expires_at, now):
            raise exceptions.AuthenticationFailed("invalid, revoked or expired token")
        if token.kind == TokenKind.USER and not token.user.is_active:
            raise exceptions.AuthenticationFailed("the token's user is inactive")
        if last_used_due(token.last_used_at, now):
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        principal = token.user if token.kind == TokenKind.USER else AgentPrincipal(token=token)
        return principal, token

    def authenticate_header(self, request: Request) -> str:
        return "Token"
