"""Verification of the OIDC token a Pub/Sub push subscription sends (`Authorization: Bearer <JWT>`,
RS256, issued by Google for the subscription's service account).

The public keys are configured on the team's credential (`config.public_keys`: {kid: PEM}), so
verification needs no network call on the hot path; refresh them from Google's published
certificates (https://www.googleapis.com/oauth2/v1/certs) when Google rotates them."""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509 import load_pem_x509_certificate

ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
LEEWAY_S = 60


class OidcError(Exception):
    """The token is missing, malformed, expired, or not for us."""


def _b64(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise OidcError("token is not base64url") from None


def _load_key(pem: str) -> rsa.RSAPublicKey:
    data = pem.encode()
    key = load_pem_x509_certificate(data).public_key() if b"CERTIFICATE" in data else (
        serialization.load_pem_public_key(data))
    if not isinstance(key, rsa.RSAPublicKey):
        raise OidcError("configured key is not RSA")
    return key


def verify(token: str, *, audience: str, public_keys: dict[str, str], email: str,
           now: float | None = None) -> dict[str, Any]:
    """Return the token's claims, or raise OidcError saying what is wrong. `email` (the push
    subscription's service account) is required: without it any Google-signed token would do."""
    parts = token.split(".")
    if len(parts) != 3:
        raise OidcError("token is not a JWT (header.payload.signature)")
    try:
        header = json.loads(_b64(parts[0]))
        claims = json.loads(_b64(parts[1]))
    except ValueError:
        raise OidcError("token header or payload is not JSON") from None
    if header.get("alg") != "RS256":
        raise OidcError(f"token alg must be RS256, got {header.get('alg')!r}")
    pem = public_keys.get(header.get("kid", ""))
    if pem is None:
        raise OidcError(f"unknown signing key id {header.get('kid')!r}")
    try:
        _load_key(pem).verify(_b64(parts[2]), f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(),
                              hashes.SHA256())
    except InvalidSignature:
        raise OidcError("token signature does not verify") from None
    now = time.time() if now is None else now
    if claims.get("iss") not in ISSUERS:
        raise OidcError(f"token issuer {claims.get('iss')!r} is not Google")
    aud = claims.get("aud")
    if aud != audience and not (isinstance(aud, list) and audience in aud):
        raise OidcError(f"token audience {aud!r} is not {audience!r}")
    if not isinstance(claims.get("exp"), int | float) or claims["exp"] + LEEWAY_S < now:
        raise OidcError("token expired")
    if not email:
        # Fail closed: an old credential saved without the service account accepts nobody.
        raise OidcError("no service account email is configured for OIDC; set config.email")
    if claims.get("email") != email or not claims.get("email_verified", False):
        raise OidcError(f"token email {claims.get('email')!r} is not the configured service account")
    return claims
