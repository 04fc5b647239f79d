"""Per-team inbound webhook credentials: creation, rotation, and a short per-process cache so the
hot path does not query them on every notice."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from controlplane.accounts.models import Team
from controlplane.common.errors import DomainError
from controlplane.webhooks import signing
from controlplane.webhooks.models import CredentialScheme, WebhookCredential, WebhookSource

CACHE_TTL_S = 5.0


def hash_secret(value: str) -> str:
    """Stored form of a compared secret (API key, password, token). They are random, so a fast
    hash is enough."""
    return hashlib.sha256(value.encode()).hexdigest()


_SECRET_SCHEMES = {CredentialScheme.API_KEY, CredentialScheme.BASIC, CredentialScheme.TOKEN}
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}")
RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "cookie", "connection",
                              "transfer-encoding", "user-agent", "webhook-id", "webhook-timestamp",
                              "webhook-signature"})
# Which schemes authenticate which source (what its view checks).
SCHEMES_BY_SOURCE: dict[str, tuple[str, ...]] = {
    WebhookSource.AWS_EVENTBRIDGE: (CredentialScheme.API_KEY, CredentialScheme.BASIC),
    WebhookSource.AWS_SNS: (CredentialScheme.SNS_TOPIC,),
    WebhookSource.GCP: (CredentialScheme.TOKEN, CredentialScheme.OIDC),
    WebhookSource.AZURE: (CredentialScheme.STANDARD_WEBHOOKS,),
    WebhookSource.GENERIC: (CredentialScheme.STANDARD_WEBHOOKS,),
}


@transaction.atomic
def credential_create(
    *,
    team: Team,
    source: str,
    scheme: str,
    name: str = "",
    header_name: str = "x-api-key",
    username: str = "",
    secret: str | None = None,
    topic_arn: str = "",
    config: dict | None = None,
) -> tuple[WebhookCredential, str]:
    """Create a credential and return it with its secret in clear (shown once; only a hash is kept
    for API keys, passwords and tokens). `secret` may be given, e.g. to match an existing
    EventBridge connection; otherwise one is generated."""
    if source not in WebhookSource.values:
        raise DomainError(f"unknown source {source!r}; expected one of {', '.join(WebhookSource.values)}",
                          field="source")
    if scheme not in CredentialScheme.values:
        raise DomainError(f"unknown scheme {scheme!r}", field="scheme")
    if scheme not in SCHEMES_BY_SOURCE[source]:
        raise DomainError(f"scheme {scheme!r} does not apply to {source}; use one of "
                          f"{', '.join(SCHEMES_BY_SOURCE[source])}", field="scheme")
    cred = WebhookCredential(team=team, source=source, scheme=scheme, name=name, config=config or {})
    plain = ""
    if scheme in _SECRET_SCHEMES:
        plain = secret or "sp_wh_" + secrets.token_urlsafe(32)
        cred.secret_hash = hash_secret(plain)
        if scheme == CredentialScheme.API_KEY:
            if not HEADER_NAME.fullmatch(header_name or "") or header_name.lower() in RESERVED_HEADERS:
                raise DomainError("header_name must be an HTTP header name (letters, digits, '-'), not a "
                                  "standard header such as Authorization or Content-Type", field="header_name")
            cred.header_name = header_name.lower()
        if scheme == CredentialScheme.BASIC:
            if not username:
                raise DomainError("basic auth needs a username", field="username")
            cred.username = username
    elif scheme == CredentialScheme.STANDARD_WEBHOOKS:
        plain = secret or signing.generate_secret()
        try:
            signing.sign(secret=plain, msg_id="check", timestamp=0, body=b"")
        except ValueError as exc:
            raise DomainError(str(exc), field="secret") from None
        cred.signing_secret = plain
    elif scheme == CredentialScheme.SNS_TOPIC:
        if not topic_arn.startswith("arn:"):
            raise DomainError(f"topic_arn must be an SNS topic ARN, got {topic_arn!r}", field="topic_arn")
        cred.topic_arn = topic_arn
    elif scheme == CredentialScheme.OIDC and not (config or {}).get("audience"):
        raise DomainError("OIDC needs config.audience, the push endpoint's URL", field="config")
    elif scheme == CredentialScheme.OIDC and "@" not in str((config or {}).get("email") or ""):
        # Without it any Google-signed token for the audience would pass, whoever's account made it.
        raise DomainError("OIDC needs config.email, the push subscription's service account", field="config")
    cred.save()
    return cred, plain


@transaction.atomic
def credential_rotate(
    *, credential: WebhookCredential, overlap: timedelta = timedelta(hours=24), secret: str | None = None
) -> tuple[WebhookCredential, str]:
    """Issue a successor with the same settings and a new secret; the old one stays valid for
    `overlap` so senders can switch without losing a notice."""
    if credential.scheme not in _SECRET_SCHEMES | {CredentialScheme.STANDARD_WEBHOOKS}:
        raise DomainError(f"a {credential.scheme} credential has no secret to rotate", field="scheme")
    new, plain = credential_create(
        team=credential.team, source=credential.source, scheme=credential.scheme, name=credential.name,
        header_name=credential.header_name or "x-api-key", username=credential.username, secret=secret,
        topic_arn=credential.topic_arn, config=credential.config,
    )
    credential.expires_at = timezone.now() + overlap
    credential.save(update_fields=["expires_at"])
    return new, plain


def credential_is_active(credential: WebhookCredential) -> bool:
    """Neither revoked nor past its rotation's expiry."""
    return credential.revoked_at is None and (credential.expires_at is None or credential.expires_at > timezone.now())


def credential_revoke(*, credential: WebhookCredential) -> WebhookCredential:
    """End a credential at once (the row stays, with `revoked_at`, for the audit trail). Revoking
    twice keeps the first time."""
    if credential.revoked_at is None:
        credential.revoked_at = timezone.now()
        credential.save(update_fields=["revoked_at"])
    return credential


@dataclass(frozen=True, slots=True)
class TeamCredentials:
    """What a webhook view needs to authenticate one team's source."""

    team_id: int
    team_slug: str
    credentials: tuple[WebhookCredential, ...]

    def of(self, *schemes: str) -> list[WebhookCredential]:
        return [c for c in self.credentials if c.scheme in schemes]


_cache: dict[tuple[str, str], tuple[float, TeamCredentials | None]] = {}
_cache_lock = threading.Lock()


def credentials_for(*, team_slug: str, source: str) -> TeamCredentials | None:
    """Active credentials of `team_slug` for `source` (None if the team does not exist), cached for
    CACHE_TTL_S per process; changes in this process clear the cache at once."""
    key = (team_slug, source)
    now = time.monotonic()
    hit = _cache.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    team = Team.objects.filter(slug=team_slug).only("id", "slug").first()
    value = None
    if team is not None:
        at = timezone.now()
        creds = WebhookCredential.objects.filter(team=team, source=source, revoked_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=at)
        )
        value = TeamCredentials(team_id=team.pk, team_slug=team.slug, credentials=tuple(creds))
    with _cache_lock:
        _cache[key] = (now + CACHE_TTL_S, value)
    return value


def credentials_cache_clear(**_: object) -> None:
    """Forget cached credentials (connected to saves and deletes of credentials)."""
    with _cache_lock:
        _cache.clear()


post_save.connect(credentials_cache_clear, sender=WebhookCredential, dispatch_uid="webhookcred_cache_save")
post_delete.connect(credentials_cache_clear, sender=WebhookCredential, dispatch_uid="webhookcred_cache_delete")
post_save.connect(credentials_cache_clear, sender=Team, dispatch_uid="webhookcred_cache_team")
