"""Verification of the OIDC token a Pub/Sub push subscription sends (`Authorization: Bearer <JWT>`,
RS256, issued by Google for the subscription's service account), with PyJWT.

Google rotates its signing keys every few days, so by default the keys come from Google's JWKS
document (tunable SPOTPIPE_GCP_OIDC_JWKS_URL), fetched by PyJWT's `PyJWKClient`: cached for
`JWKS_LIFESPAN_S`, and fetched again when a token names a key id the cache does not hold (how a
rotation shows up; at most once per `JWKS_REFRESH_COOLDOWN_S`). A credential may instead pin keys
(`config.public_keys`: {kid: PEM}, for a control plane that cannot reach Google); pinned keys are
then the only ones accepted."""

from __future__ import annotations

import functools
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import load_pem_x509_certificate

from controlplane.tunables import tunable

ISSUERS = ("accounts.google.com", "https://accounts.google.com")
LEEWAY_S = 60
# Google's keys live for about two weeks; an hour bounds how long a revoked key is still trusted.
JWKS_LIFESPAN_S = 3600
# A slow Google must not hold a webhook worker: the push is retried by Pub/Sub anyway.
JWKS_TIMEOUT_S = 5
# An unknown key id fetches the document again at most this often, so tokens with made-up key ids
# cannot turn every request into a request to Google.
JWKS_REFRESH_COOLDOWN_S = 30.0


class OidcError(Exception):
    """The token is missing, malformed, expired, or not for us."""


class KeysUnavailable(OidcError):
    """Google's signing keys could not be fetched: the token was not judged (retry later)."""


@functools.cache
def _jwks_client(url: str) -> jwt.PyJWKClient:
    # One client per URL per process, so its key cache is shared by every request.
    return jwt.PyJWKClient(url, cache_keys=True, lifespan=JWKS_LIFESPAN_S, timeout=JWKS_TIMEOUT_S,
                           cooldown_duration=JWKS_REFRESH_COOLDOWN_S)


def jwks_cache_clear() -> None:
    """Forget the fetched keys (tests; an operator changing the JWKS URL restarts anyway)."""
    _jwks_client.cache_clear()


def _pinned_key(token: str, public_keys: dict[str, str]) -> Any:
    kid = _header(token).get("kid", "")
    pem = public_keys.get(kid)
    if pem is None:
        raise OidcError(f"unknown signing key id {kid!r}")
    data = pem.encode()
    try:
        return (load_pem_x509_certificate(data).public_key() if b"CERTIFICATE" in data
                else serialization.load_pem_public_key(data))
    except ValueError:
        raise OidcError(f"configured key {kid!r} is not a PEM certificate or public key") from None


def _header(token: str) -> dict[str, Any]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.DecodeError as exc:
        raise OidcError(f"token is not a JWT: {exc}") from None


def _fetched_key(token: str) -> Any:
    try:
        return _jwks_client(tunable("SPOTPIPE_GCP_OIDC_JWKS_URL")).get_signing_key_from_jwt(token).key
    except jwt.PyJWKClientConnectionError as exc:
        raise KeysUnavailable(f"Google's signing keys could not be fetched: {exc}") from None
    except jwt.PyJWKClientError as exc:  # no key with the token's kid, even after a fresh fetch
        raise OidcError(f"unknown signing key: {exc}") from None
    except jwt.DecodeError as exc:
        raise OidcError(f"token is not a JWT: {exc}") from None


def verify(token: str, *, audience: str, email: str, public_keys: dict[str, str] | None = None) -> dict[str, Any]:
    """Return the token's claims, or raise OidcError saying what is wrong. `email` (the push
    subscription's service account) is required: without it any Google-signed token would do."""
    if not email:
        # Fail closed: an old credential saved without the service account accepts nobody.
        raise OidcError("no service account email is configured for OIDC; set config.email")
    if _header(token).get("alg") != "RS256":
        raise OidcError(f"token alg must be RS256, got {_header(token).get('alg')!r}")
    key = _pinned_key(token, public_keys) if public_keys else _fetched_key(token)
    try:
        claims = jwt.decode(token, key, algorithms=["RS256"], audience=audience, issuer=ISSUERS,
                            leeway=LEEWAY_S, options={"require": ["exp", "iss", "aud"]})
    except jwt.InvalidSignatureError:
        raise OidcError("token signature does not verify") from None
    except jwt.ExpiredSignatureError:
        raise OidcError("token expired") from None
    except jwt.InvalidAudienceError:
        raise OidcError(f"token audience is not {audience!r}") from None
    except jwt.InvalidIssuerError:
        raise OidcError("token issuer is not Google") from None
    except jwt.InvalidTokenError as exc:
        raise OidcError(f"token refused: {exc}") from None
    if claims.get("email") != email or claims.get("email_verified") is not True:
        raise OidcError(f"token email {claims.get('email')!r} is not the configured service account")
    return claims
