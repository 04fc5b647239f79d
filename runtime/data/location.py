"""A prepared corpus's location: a local folder or an `s3://bucket/prefix/`, behind one small
interface (read a whole object, read a byte range, write an object, list names), so `prepare`
writes and `formats/shards` reads the same way wherever the corpus lives.

Names are relative to the location ("index.json", "shards/all-000003-0000.bin"). S3 is reached
with boto3's default credentials, region and `AWS_ENDPOINT_URL` (S3-compatible stores), as the
other S3 sources are (`runtime.data.s3`); its errors become a `DataError` naming the object.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from runtime.data.errors import DataError

PRESIGNED_S = 900
"""Lifetime of the presigned URLs range reads use (renewed at half of it)."""


class Missing(DataError):
    """The object is not at the location."""


class Location(Protocol):
    url: str
    """How the user wrote it (a folder path or s3://bucket/prefix/), for messages."""

    def read(self, name: str) -> bytes: ...

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        """`length` bytes from `start` (fewer at the end) and the object's whole size."""
        ...

    def write(self, name: str, data: bytes) -> None:
        """Write the object whole: readers see the old object or the new one, never a part."""
        ...

    def exists(self, name: str) -> bool: ...

    def size(self, name: str) -> int | None: ...


class LocalFolder:
    def __init__(self, url: str) -> None:
        self.url = url
        self.root = Path(url)

    def _path(self, name: str) -> Path:
        return self.root / name

    def read(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise Missing(f"{self._path(name)} does not exist") from None
        except OSError as exc:
            raise DataError(f"{self._path(name)}: cannot read it ({exc.strerror})") from None

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        path = self._path(name)
        try:
            with open(path, "rb") as handle:
                total = os.fstat(handle.fileno()).st_size
                handle.seek(start)
                return handle.read(length), total
        except FileNotFoundError:
            raise Missing(f"{path} does not exist") from None
        except OSError as exc:
            raise DataError(f"{path}: cannot read it ({exc.strerror})") from None

    def write(self, name: str, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.part-{os.getpid()}")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def size(self, name: str) -> int | None:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            return None


class S3Prefix:
    def __init__(self, url: str) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        self.prefix = prefix
        self._client = None
        self._urls: dict[str, tuple[str, float]] = {}
        self._urls_lock = threading.Lock()
        self._pool = None

    @property
    def _http(self):
        if self._pool is None:
            import urllib3

            self._pool = urllib3.PoolManager(maxsize=32, block=False)
        return self._pool

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            # Many ranges are fetched at once by the prefetcher's threads (one pool per process).
            self._client = boto3.client("s3", config=Config(max_pool_connections=32,
                                                            retries={"max_attempts": 4, "mode": "standard"}))
        return self._client

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _error(self, name: str, exc: Exception) -> DataError:
        from runtime.data.s3 import _error

        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        where = f"s3://{self.bucket}/{self._key(name)}"
        if code in ("NoSuchKey", "404", "NotFound"):
            return Missing(f"{where} does not exist")
        return _error(where, exc)

    def _presigned(self, name: str, fresh: bool = False) -> str:
        """A presigned GET URL of the object, reused for every range until it nears expiry: a range
        read then costs one plain HTTP request (botocore's per-call work, a few ms of CPU under the
        GIL, would take a share of the training step at a few reads per sample)."""
        from botocore.exceptions import BotoCoreError

        now = time.monotonic()
        with self._urls_lock:
            found = self._urls.get(name)
        if found is not None and found[1] > now and not fresh:
            return found[0]
        try:
            url = self.client.generate_presigned_url("get_object", ExpiresIn=PRESIGNED_S,
                                                     Params={"Bucket": self.bucket, "Key": self._key(name)})
        except BotoCoreError as exc:  # no credentials in the chain
            raise DataError(f"s3://{self.bucket}/{self._key(name)}: cannot sign a request ({exc})") from None
        with self._urls_lock:
            self._urls[name] = (url, now + PRESIGNED_S / 2)
        return url

    def _get(self, name: str, headers: dict[str, str]) -> Any:
        """GET through the object's presigned URL; `Missing` on 404, `DataError` on other failures
        (a bucket that does not exist or denies access is told by botocore, when presigning fails or
        by `size`)."""
        import urllib3

        where = f"s3://{self.bucket}/{self._key(name)}"
        for fresh in (False, True):  # a 403 once more with a new signature (temporary credentials rotate)
            try:
                answer = self._http.request("GET", self._presigned(name, fresh), headers=headers,
                                            retries=urllib3.Retry(total=4, backoff_factor=0.2,
                                                                  status_forcelist=(500, 502, 503, 504)),
                                            timeout=urllib3.Timeout(connect=10, read=60))
            except urllib3.exceptions.HTTPError as exc:
                # Never the URL: its query is a signature that reads the object for minutes.
                reason = getattr(exc, "reason", None) or exc
                text = re.sub(r"\?\S*", "?...", str(reason))
                raise DataError(f"{where}: cannot reach S3 ({type(reason).__name__}: {text})") from None
            if answer.status != 403:
                break
        if answer.status == 404:
            if b"NoSuchBucket" in answer.data:
                raise DataError(f"{where}: bucket {self.bucket!r} does not exist (or is not visible to these "
                                "credentials)")
            raise Missing(f"{where} does not exist")
        if answer.status == 403:
            raise DataError(f"{where}: access denied (403); expected credentials that may read it")
        if answer.status not in (200, 206, 416):
            raise DataError(f"{where}: S3 answered HTTP {answer.status}: {answer.data[:200]!r}")
        return answer

    def read(self, name: str) -> bytes:
        return self._get(name, {}).data

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        answer = self._get(name, {"Range": f"bytes={start}-{start + length - 1}"})
        if answer.status == 416:  # a range past the end: nothing there
            return b"", self.size(name) or 0
        if answer.status == 200:  # the whole object: a store that ignores ranges
            return answer.data[start : start + length], len(answer.data)
        content_range = answer.headers.get("Content-Range", "")  # "bytes 0-99/1234"
        return answer.data, int(content_range.rpartition("/")[2])

    def write(self, name: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:  # a PUT replaces an object atomically
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(name, exc) from None

    def size(self, name: str) -> int | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(name))["ContentLength"]
        except (BotoCoreError, ClientError) as exc:
            if isinstance(self._error(name, exc), Missing):
                return None
            raise self._error(name, exc) from None

    def exists(self, name: str) -> bool:
        return self.size(name) is not None


def open_location(url: str) -> Location:
    """The location `url` names: `s3://bucket/prefix/` or a local folder."""
    return S3Prefix(url) if url.startswith("s3://") else LocalFolder(url)
