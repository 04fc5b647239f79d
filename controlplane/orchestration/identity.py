"""Proof that an enrolling node is the instance we launched: the AWS instance identity document.

An enrolment key alone is a bearer secret: whoever learns it could enrol a machine of their own.
On AWS every instance can read a JSON *instance identity document* (`instanceId`, `accountId`,
`region`, ...) and AWS's signature over it from IMDSv2. We use the **base64-encoded signature**
(`/latest/dynamic/instance-identity/signature`): an RSA PKCS#1 v1.5 signature over the SHA-256 of
the document's exact bytes, verified with AWS's per-region *RSA* public certificate (not the DSA
one, which is for `pkcs7`, nor the RSA-2048 one, which is for `rsa2048`). This is what
`openssl dgst -sha256 -verify key -signature signature document` checks.

The control plane then requires `instanceId` to be the launched instance's provider id and
`accountId` / `region` to be the configured ones. Settings:

- `SPOTPIPE_ENROLL_VERIFY_IDENTITY`: `auto` (default: enforced for the `aws` provider), `on`, `off`.
- `SPOTPIPE_AWS_IDENTITY_CERT`: a PEM file with the certificate, or a directory of
  `<region>.pem` files (AWS publishes one per region); the region's file wins when present.
- `SPOTPIPE_AWS_ACCOUNT_ID`: the account nodes must belong to (required while enforcing);
  the region is `SPOTPIPE_AWS_REGION` (`AWS_DEFAULT_REGION`).

Local nodes' metadata servers sign their document with a locally generated key, so tests run this
same verification (`SPOTPIPE_LOCAL_IDENTITY_KEY`, see `local/metadata.py`).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from controlplane.common.errors import DomainError

IDENTITY_DOCUMENT_PATH = "/latest/dynamic/instance-identity/document"
IDENTITY_SIGNATURE_PATH = "/latest/dynamic/instance-identity/signature"


class IdentityRejected(DomainError):
    """The node could not prove it is the launched instance (answered 403)."""

    status_code = 403


@dataclass(frozen=True, slots=True)
class IdentityPolicy:
    """What an enrolling node's identity document must show."""

    certificate_pem: bytes
    account_id: str
    region: str


def verify_identity_document(
    *, document: str, signature_b64: str, expected_instance_id: str, policy: IdentityPolicy
) -> dict[str, Any]:
    """Check AWS's signature over `document` and that it names the expected instance, account and
    region. Returns the parsed document; raises IdentityRejected naming what failed."""
    if not document or not signature_b64:
        raise IdentityRejected("the instance identity document and its signature are required to enrol on aws",
                               field="identity_signature" if document else "identity_document")
    try:
        signature = base64.b64decode("".join(signature_b64.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IdentityRejected("the identity signature is not base64", field="identity_signature") from exc
    try:
        certificate = x509.load_pem_x509_certificate(policy.certificate_pem)
    except ValueError as exc:
        raise IdentityRejected("the configured AWS identity certificate cannot be read") from exc
    key = certificate.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise IdentityRejected("the configured AWS identity certificate is not an RSA certificate "
                               "(the base64 signature is verified with the region's RSA certificate)")
    try:
        key.verify(signature, document.encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature as exc:
        raise IdentityRejected("the instance identity document's signature does not verify with the AWS "
                               "certificate: it was not signed by AWS or was altered", field="identity_signature"
                               ) from exc
    try:
        fields = json.loads(document)
    except ValueError as exc:
        raise IdentityRejected("the instance identity document is not JSON", field="identity_document") from exc
    if not isinstance(fields, dict):
        raise IdentityRejected("the instance identity document is not a JSON object", field="identity_document")
    checks = (("instanceId", expected_instance_id, "the launched instance"),
              ("accountId", policy.account_id, "the configured account"),
              ("region", policy.region, "the configured region"))
    for name, expected, what in checks:
        if str(fields.get(name, "")) != expected:
            raise IdentityRejected(f"the identity document's {name} {fields.get(name)!r} is not {what} "
                                   f"({expected!r})", field="identity_document")
    return fields


def load_certificate(path: str, region: str) -> bytes:
    """The PEM certificate at `path`, or `<path>/<region>.pem` when `path` is a directory."""
    location = Path(path)
    if location.is_dir():
        location = location / f"{region}.pem"
    try:
        return location.read_bytes()
    except OSError as exc:
        raise IdentityRejected(f"no AWS identity certificate at {location}; set SPOTPIPE_AWS_IDENTITY_CERT") from exc


def identity_policy_for(provider: str, *, region: str = "") -> IdentityPolicy | None:
    """The policy enrolment enforces for nodes of `provider` launched in `region` (one of
    `SPOTPIPE_AWS_REGIONS`; "": the default region), or None: not enforced."""
    from controlplane.tunables import tunable

    mode = str(tunable("SPOTPIPE_ENROLL_VERIFY_IDENTITY")).lower()
    if mode not in ("auto", "on", "off"):
        raise IdentityRejected(f"SPOTPIPE_ENROLL_VERIFY_IDENTITY is {mode!r}; expected auto, on or off")
    if mode == "off" or (mode == "auto" and provider != "aws"):
        return None
    default = str(tunable("SPOTPIPE_AWS_REGION"))
    if region and region != default and region not in tunable("SPOTPIPE_AWS_REGIONS"):
        raise IdentityRejected(f"the node was launched in {region!r}, not a region of SPOTPIPE_AWS_REGIONS")
    region = region or default
    account = str(tunable("SPOTPIPE_AWS_ACCOUNT_ID"))
    cert_path = str(tunable("SPOTPIPE_AWS_IDENTITY_CERT"))
    if not account or not cert_path:
        # Fail closed: enforcing without a certificate or an account would accept anyone.
        raise IdentityRejected("enrolment requires an instance identity check but SPOTPIPE_AWS_ACCOUNT_ID or "
                               "SPOTPIPE_AWS_IDENTITY_CERT is not set")
    return IdentityPolicy(certificate_pem=load_certificate(cert_path, region), account_id=account, region=region)


def generate_signing_pair(*, common_name: str = "spotpipe local identity") -> tuple[bytes, bytes]:
    """A fresh RSA key and a self-signed certificate for it (PEM), standing in for AWS's pair on local
    nodes and in tests: the node signs with the key, the control plane verifies with the certificate."""
    from datetime import UTC, datetime, timedelta

    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=3650)).sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)
