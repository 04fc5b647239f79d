"""Amazon SNS message verification and subscription confirmation.

The signing certificate is fetched only from a URL whose host matches
`SPOTPIPE_SNS_CERT_HOST_PATTERN` (controlplane/tunables.py; default AWS's
`sns.<region>.amazonaws.com[.cn]`) over HTTPS, and cached per process. `fetch_url` (certificate
download) and `confirm_get` (the SubscribeURL GET) are module attributes so tests can point them at
a local server.

A message is refused when its `Timestamp` (signed, and the same on every retry of a delivery) is
older than SPOTPIPE_SNS_MAX_AGE_S (default 3600 s, the longest retry policy SNS allows for HTTP(S)
subscribers) or more than CLOCK_SKEW_S in the future: a captured message cannot be replayed later."""

from __future__ import annotations

import base64
import binascii
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from controlplane.tunables import tunable

HTTP_TIMEOUT_S = 5.0
# How far ahead of our clock a Timestamp may be (SNS's clock and ours disagree a little).
CLOCK_SKEW_S = 300

MESSAGE_TYPES = ("Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation")
_SIGNED_KEYS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
_HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}


class SnsError(Exception):
    """A message that fails verification; `field` names the offending key."""

    def __init__(self, message: str, *, field: str = "Signature") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def fetch_url(url: str) -> bytes:
    """GET a signing certificate (replaced in tests)."""
    response = requests.get(url, timeout=HTTP_TIMEOUT_S)
    response.raise_for_status()
    return response.content


def confirm_get(url: str) -> int:
    """GET the SubscribeURL to confirm a subscription; returns the HTTP status (replaced in tests)."""
    return requests.get(url, timeout=HTTP_TIMEOUT_S).status_code


def check_aws_url(url: Any, *, field: str) -> str:
    """Raise SnsError unless `url` is https (or allowed http) on a host matching the pattern."""
    if not isinstance(url, str) or not url:
        raise SnsError(f"missing {field}", field=field)
    parts = urlsplit(url)
    schemes = {"https", "http"} if tunable("SPOTPIPE_SNS_ALLOW_HTTP") else {"https"}
    if parts.scheme not in schemes:
        raise SnsError(f"{field} must use https, got {parts.scheme!r}", field=field)
    host = parts.hostname or ""
    if not re.match(tunable("SPOTPIPE_SNS_CERT_HOST_PATTERN"), host):
        raise SnsError(f"{field} host {host!r} is not an allowed SNS host", field=field)
    return url


_cert_cache: dict[str, rsa.RSAPublicKey] = {}
_cert_lock = threading.Lock()


def _public_key(cert_url: str) -> rsa.RSAPublicKey:
    key = _cert_cache.get(cert_url)
    if key is not None:
        return key
    check_aws_url(cert_url, field="SigningCertURL")
    if not urlsplit(cert_url).path.endswith(".pem"):
        raise SnsError("SigningCertURL must point to a .pem certificate", field="SigningCertURL")
    try:
        cert = x509.load_pem_x509_certificate(fetch_url(cert_url))
    except (requests.RequestException, ValueError) as exc:
        raise SnsError(f"could not load the signing certificate: {exc}", field="SigningCertURL") from None
    key = cert.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise SnsError("the signing certificate has no RSA key", field="SigningCertURL")
    with _cert_lock:
        _cert_cache[cert_url] = key
    return key


def cert_cache_clear() -> None:
    """Forget downloaded certificates (tests)."""
    with _cert_lock:
        _cert_cache.clear()


def string_to_sign(message: dict) -> bytes:
    """SNS's canonical form: `Key\\nValue\\n` for the type's keys, in order, skipping absent ones."""
    keys = _SIGNED_KEYS[message["Type"]]
    return "".join(f"{k}\n{message[k]}\n" for k in keys if message.get(k) is not None).encode()


def max_age() -> timedelta:
    """The replay window (setting SPOTPIPE_SNS_MAX_AGE_S, seconds)."""
    return timedelta(seconds=float(tunable("SPOTPIPE_SNS_MAX_AGE_S")))


def check_timestamp(value: Any, *, now: datetime | None = None) -> datetime:
    """Raise SnsError unless `value` is an ISO 8601 time within the replay window of `now`."""
    if not isinstance(value, str) or not value:
        raise SnsError("missing Timestamp", field="Timestamp")
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SnsError(f"Timestamp {value[:40]!r} is not an ISO 8601 time", field="Timestamp") from None
    if at.tzinfo is None:
        raise SnsError(f"Timestamp {value[:40]!r} has no time zone", field="Timestamp")
    now = now or datetime.now(UTC)
    if at < now - max_age():
        raise SnsError(f"Timestamp {value[:40]!r} is older than the replay window of "
                       f"{max_age().total_seconds():.0f} s", field="Timestamp")
    if at > now + timedelta(seconds=CLOCK_SKEW_S):
        raise SnsError(f"Timestamp {value[:40]!r} is in the future", field="Timestamp")
    return at


def verify(message: dict) -> None:
    """Raise SnsError unless `message` carries a valid SNS signature (SignatureVersion 1 or 2) and
    a `Timestamp` within the replay window (checked first: it costs no certificate)."""
    if message.get("Type") not in MESSAGE_TYPES:
        raise SnsError(f"unsupported Type {message.get('Type')!r}; expected one of {', '.join(MESSAGE_TYPES)}",
                       field="Type")
    for key in ("MessageId", "TopicArn", "Timestamp", "Signature", "SigningCertURL"):
        if not isinstance(message.get(key), str) or not message[key]:
            raise SnsError(f"missing {key}", field=key)
    check_timestamp(message["Timestamp"])
    version = str(message.get("SignatureVersion", ""))
    if version not in _HASHES:
        raise SnsError(f"unsupported SignatureVersion {version!r}; expected 1 or 2", field="SignatureVersion")
    try:
        signature = base64.b64decode(message["Signature"], validate=True)
    except (binascii.Error, ValueError):
        raise SnsError("Signature must be base64") from None
    key = _public_key(message["SigningCertURL"])
    try:
        key.verify(signature, string_to_sign(message), padding.PKCS1v15(), _HASHES[version]())
    except InvalidSignature:
        raise SnsError("SNS signature does not verify against the signing certificate") from None
