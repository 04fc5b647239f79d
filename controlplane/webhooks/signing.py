"""Standard Webhooks signatures (https://www.standardwebhooks.com): HMAC-SHA256 over
`{webhook-id}.{webhook-timestamp}.{body}`, keyed by the base64 part of a `whsec_...` secret, sent
as `webhook-signature: v1,<base64> [v1,<base64> ...]` (several while a secret rotates)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


class SignatureError(Exception):
    """The signature, its headers or its timestamp are missing or wrong; `str()` says which."""


def generate_secret() -> str:
    """A new random `whsec_...` secret (24 random bytes)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def _key(secret: str) -> bytes:
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError as exc:
        raise ValueError("a Standard Webhooks secret is 'whsec_' followed by base64") from exc


def sign(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `v1,<base64>` signature of one message."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(
    *, secret: str, msg_id: str, body: bytes, timestamp: int | None = None, extra_secrets: Iterable[str] = ()
) -> dict[str, str]:
    """The three headers a sender adds. `extra_secrets` add signatures (space-separated), e.g. the
    previous secret while a rotation's grace period runs."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    signatures = [sign(secret=s, msg_id=msg_id, timestamp=timestamp, body=body) for s in (secret, *extra_secrets)]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }


def verify(
    *,
    secrets_: Iterable[str],
    msg_id: str | None,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> None:
    """Raise SignatureError unless one of the `v1` signatures matches one of `secrets_` and the
    timestamp is within `tolerance_s` of now (replay protection)."""
    if not msg_id:
        raise SignatureError("missing webhook-id header")
    if not timestamp:
        raise SignatureError("missing webhook-timestamp header")
    if not signature:
        raise SignatureError("missing webhook-signature header")
    try:
        ts = int(timestamp)
    except ValueError:
        raise SignatureError(f"webhook-timestamp must be integer seconds, got {timestamp[:40]!r}") from None
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance_s:
        raise SignatureError(
            f"webhook-timestamp {ts} is {int(now - ts)} s from now; more than the {tolerance_s} s tolerance"
        )
    offered = [part.split(",", 1)[1] for part in signature.split() if part.startswith("v1,")]
    if not offered:
        raise SignatureError("webhook-signature has no 'v1,<base64>' entry")
    for secret in secrets_:
        expected = sign(secret=secret, msg_id=msg_id, timestamp=ts, body=body).split(",", 1)[1]
        # As bytes: compare_digest refuses a str with non-ASCII characters (a TypeError, a 500).
        if any(hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in offered):
            return
    raise SignatureError("webhook-signature does not match any active secret")
