"""What the control plane checks of a job's data before any node is bought (docs/api.md, "The job's
data"). The grammar of `data.source` and `data.tokenizer` is the runtime's (`runtime.config.parse_source`,
checked when `job_submit` builds the JobConfig); this module adds what only a look at S3 can tell:

- an `s3://` source: the bucket exists and the control plane's AWS credentials can list at least one
  object under the prefix (up to the first glob character);
- an `s3://` tokenizer: the object exists (`HeadObject`).

Each problem is a 400 under `config.data.source` or `config.data.tokenizer`. What is not checked,
and why, is said in the notes stored with the job's `submitted` event:

- S3, when boto3 finds no credentials in the control plane's environment (its default chain, as
  for the aws provider; there are no per-team cloud credentials), when `SPOTPIPE_DATA_S3_CHECK` is
  off, or when S3 cannot be reached (a network error, throttling, a 5xx: S3 being away is no
  reason to refuse a job; the nodes fetch it later);
- local paths and globs: they name the nodes' disks, which the control plane cannot see; a node
  that lacks the file fails the job once with the runtime's message;
- `py:` sources: user code, imported on the nodes only. The control plane never imports it (only
  `runtime.config`'s regular expression reads it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from controlplane.tunables import tunable
from runtime.config import DataSpec, parse_source

logger = logging.getLogger(__name__)

SOURCE_FIELD = "config.data.source"
TOKENIZER_FIELD = "config.data.tokenizer"
GLOB_CHARACTERS = "*?["
# S3 answers that say the object or bucket is not there, or is not ours to read.
MISSING_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "404", "NotFound"})
DENIED_CODES = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId",
                          "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"})


@dataclass
class DataCheck:
    """The outcome: `errors` keyed by request field (400), `notes` on what was not checked."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def error(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _literal_prefix(key: str) -> str:
    """The key prefix before the first glob character (`corpus/*.txt` -> `corpus/`)."""
    cut = min((key.index(c) for c in GLOB_CHARACTERS if c in key), default=len(key))
    return key[:cut]


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def s3_client() -> Any | None:
    """A boto3 S3 client with the control plane's credentials (boto3's default chain), short timeouts
    and one retry, or None when the chain finds no credentials."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    if session.get_credentials() is None:
        return None
    endpoint = tunable("SPOTPIPE_S3_ENDPOINT_URL") or None
    config = Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"},
                    s3={"addressing_style": "path"} if endpoint else {})
    return session.client("s3", region_name=tunable("SPOTPIPE_AWS_REGION"),
                          endpoint_url=endpoint, config=config)


def _s3_problem(call: str, exc: Exception, uri: str) -> str | None:
    """The 400 message for an S3 answer, or None when it says nothing about the job (S3 is away)."""
    code = _error_code(exc)
    if code in MISSING_CODES:
        what = "bucket" if code == "NoSuchBucket" else "object"
        return f"{uri}: no such {what} ({call}: {code}, asked with the control plane's AWS credentials)"
    if code in DENIED_CODES:
        return (f"{uri}: the control plane's AWS credentials may not read it ({call}: {code}); give its role "
                "s3:ListBucket and s3:GetObject on the data, or set SPOTPIPE_DATA_S3_CHECK=false "
                "if only the nodes' role may")
    return None


def check_data(data: DataSpec) -> DataCheck:
    """Check `data` (already valid for the runtime's grammar) as far as the control plane can."""
    result = DataCheck()
    source = parse_source(data.source) if data.source else None
    s3_targets: list[tuple[str, str, str]] = []  # (field, kind: prefix|object, uri)
    if source is not None:
        if source.format == "py":
            result.notes.append("py: sources are user code: imported on the nodes only")
        elif source.is_s3:
            s3_targets.append((SOURCE_FIELD, "prefix", source.location))
        else:
            result.notes.append(f"{source.location} is a path on the nodes' disks: checked by each node")
    if data.tokenizer.startswith("s3://"):
        s3_targets.append((TOKENIZER_FIELD, "object", data.tokenizer))
    elif data.tokenizer != "byte":
        result.notes.append(f"tokenizer {data.tokenizer} is a path on the nodes' disks: checked by each node")
    if not s3_targets:
        return result
    if not tunable("SPOTPIPE_DATA_S3_CHECK"):
        result.notes.append("s3 not checked: SPOTPIPE_DATA_S3_CHECK is off")
        return result
    client = s3_client()
    if client is None:
        result.notes.append("s3 not checked: the control plane has no AWS credentials")
        return result
    for name, kind, uri in s3_targets:
        bucket, key = _split_s3(uri)
        call = "ListObjectsV2" if kind == "prefix" else "HeadObject"
        try:
            if kind == "prefix":
                prefix = _literal_prefix(key)
                listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
                if not listed.get("KeyCount") and not listed.get("Contents"):
                    result.error(name, f"{uri}: bucket {bucket!r} holds no object under {prefix or 'its root'!r}")
            elif not key or key.endswith("/"):
                result.error(name, f"{uri}: expected the s3 URI of a tokenizer.json object, not a prefix")
            else:
                client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:  # botocore's ClientError, connection errors and timeouts
            problem = _s3_problem(call, exc, uri)
            if problem is None:
                logger.warning("data check: %s %s not checked: %s", call, uri, exc)
                result.notes.append(f"{uri} not checked: s3 did not answer ({type(exc).__name__})")
            else:
                result.error(name, problem)
        else:
            result.notes.append(f"{uri} checked on s3")
    return result
