"""S3 sources: `s3://bucket/key` (one object) or `s3://bucket/prefix/` (every object under it),
mirrored into the node cache so a format module reads local files.

The mirror of a location is `<cache>/s3/<sha256(location)[:20]>/files/<key relative to the
prefix>`, one per location (so removing objects gone from S3 never touches another job's mirror).
Each object is downloaded to a temporary file in its folder and `os.replace`d in, then its size and
ETag go to a sidecar under `meta/`; an object whose sidecar matches the listing is not downloaded
again. One process per node syncs a location at a time (`flock`); the others wait and then find
everything current. boto3 takes credentials, region and `AWS_ENDPOINT_URL` from the environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runtime.data.errors import DataError


@dataclass(frozen=True, slots=True)
class Fetched:
    path: Path
    """The local copy: the object's file, or the folder mirroring the prefix."""
    files: list[Path]
    """Every local file, sorted by key."""


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (created if missing); released when the process dies."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _split(location: str) -> tuple[str, str]:
    bucket, _, key = location.removeprefix("s3://").partition("/")
    return bucket, key


def _client():
    import boto3

    return boto3.client("s3")


def _error(location: str, exc: Exception) -> DataError:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        bucket = _split(location)[0]
        if code in ("NoSuchBucket", "404"):
            return DataError(f"{location}: bucket {bucket!r} does not exist (or is not visible to these credentials)")
        if code in ("AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return DataError(f"{location}: access denied ({code}); expected credentials that may list and read it")
        return DataError(f"{location}: S3 answered {code}: {exc}")
    return DataError(f"{location}: cannot reach S3 ({type(exc).__name__}: {exc})")


def list_objects(location: str) -> tuple[str, list[dict]]:
    """(the key prefix files are relative to, the objects: Key, Size, ETag). A location naming one
    object exactly is that object; otherwise it is a folder (`prefix/`)."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _split(location)
    client = _client()
    try:
        objects = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            objects.extend(page.get("Contents", []))
    except (BotoCoreError, ClientError) as exc:
        raise _error(location, exc) from None
    exact = [o for o in objects if o["Key"] == key]
    if exact and key:
        return key.rpartition("/")[0] + "/" if "/" in key else "", exact
    folder = key if not key or key.endswith("/") else key + "/"
    # Keys ending in "/" are the console's "folders": no data.
    objects = [o for o in objects if o["Key"].startswith(folder) and not o["Key"].endswith("/")]
    if not objects:
        raise DataError(f"{location}: no objects under s3://{bucket}/{folder}; expected the data's files there")
    return folder, sorted(objects, key=lambda o: o["Key"])


def fetch(location: str, cache_dir: Path) -> Fetched:
    """Mirror `location` into the node cache (downloading only what changed) and return the copy."""
    from botocore.exceptions import BotoCoreError, ClientError

    from runtime.data.hygiene import touch

    root = cache_dir / "s3" / hashlib.sha256(location.encode()).hexdigest()[:20]
    bucket, key = _split(location)
    with exclusive(root.with_name(root.name + ".lock")):
        prefix, objects = list_objects(location)
        files, wanted = [], set()
        client = _client()
        for obj in objects:
            relative = obj["Key"][len(prefix):]
            local, meta = root / "files" / relative, root / "meta" / (relative + ".json")
            files.append(local)
            wanted.add(local)
            expected = {"size": obj["Size"], "etag": obj.get("ETag", "")}
            if local.is_file() and local.stat().st_size == obj["Size"] and _read_json(meta) == expected:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            temporary = local.with_name(f".{local.name}.part-{os.getpid()}")
            try:
                client.download_file(bucket, obj["Key"], str(temporary))
                os.replace(temporary, local)
            except (BotoCoreError, ClientError) as exc:
                raise _error(f"s3://{bucket}/{obj['Key']}", exc) from None
            finally:
                temporary.unlink(missing_ok=True)
            _write_json(meta, expected)
        _remove_stale(root / "files", wanted)
        (root / ".location").write_text(location)
        touch(root)
    path = files[0] if len(objects) == 1 and objects[0]["Key"] == key else root / "files"
    return Fetched(path=path, files=files)


def _remove_stale(folder: Path, wanted: set[Path]) -> None:
    """Drop local copies of objects no longer under the prefix (and a killed download's part files),
    so a folder source reads exactly what S3 holds."""
    for path in folder.rglob("*"):
        if path.is_file() and path not in wanted:
            path.unlink()


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.part-{os.getpid()}")
    temporary.write_text(json.dumps(value, sort_keys=True))
    os.replace(temporary, path)
