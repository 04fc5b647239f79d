"""A job's artifacts: the final weights its workers export (runtime/checkpointing/export.py) into the job's folder
of the artifact store (`SPOTPIPE_ARTIFACTS`, `<store>/job-<id>-<key>/`), listed and served by the API.

The control plane hands the folder to the agents in the `run` command (`job.artifacts`); every
worker of the final layout writes its shards there at the end of the job, the last one the index
(so a listing never names a file that is not whole). Checksums are computed once per file and kept
in a sidecar (`.sha256.json`, keyed by name, size and modification time) in the same folder."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from django.http import Http404

from controlplane.jobs.models import TrainingJob
from controlplane.tunables import tunable
from runtime.checkpointing.durability import CHECKPOINTS, complete_steps
from runtime.models.hf_layout import CONFIG, HF_FILES, HF_FOLDER

logger = logging.getLogger(__name__)

SIDECAR = ".sha256.json"
# What a job's folder may hold that the API serves: the export's weight files, its optimizer state,
# their indexes, spotpipe.json, and the Hugging Face folder of `export = "hf"`. Nothing else
# (temporary files, the sidecar, checkpoints) is listed or served.
ARTIFACT_NAME = re.compile(
    r"(model|optimizer)(-\d{5}-of-\d{5})?\.safetensors|(model|optimizer)\.safetensors\.index\.json|spotpipe\.json"
    rf"|{HF_FOLDER}/({'|'.join(re.escape(name) for name in HF_FILES)})"
)
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Artifact:
    name: str
    size: int
    sha256: str
    version: str
    """What identifies this version of the file: `mtime_ns` locally, the ETag on S3."""


def artifact_store() -> str:
    """The artifact store's root: a local folder or `s3://bucket/prefix`."""
    return str(tunable("SPOTPIPE_ARTIFACTS"))


def job_artifacts_location(*, job: TrainingJob) -> str:
    """The job's folder in the artifact store (`job-<id>-<artifacts_key>`; `job-<id>` for jobs older than the
    key): what its workers get as their export folder, checkpoints included. The key keeps a reused id (a
    reset database, a second control plane on the same store) away from another job's checkpoints, which a
    run would otherwise restore from or prune."""
    name = f"job-{job.pk}-{job.artifacts_key}" if job.artifacts_key else f"job-{job.pk}"
    store = artifact_store()
    if store.startswith("s3://"):
        return f"{store.rstrip('/')}/{name}"
    return str(Path(store) / name)


class _LocalFolder:
    def __init__(self, location: str) -> None:
        self.root = Path(location)

    def read_text(self, name: str) -> str | None:
        try:
            return (self.root / name).read_text()
        except OSError:
            return None

    def stat(self, name: str) -> tuple[int, str] | None:
        """(size, version) of a regular file (no links, nor in a linked folder), else None."""
        path = self.root / name
        if any(p.is_symlink() for p in (path, *path.parents[: len(Path(name).parts) - 1])) or not path.is_file():
            return None
        st = path.stat()
        return st.st_size, str(st.st_mtime_ns)

    def chunks(self, name: str) -> Iterator[bytes]:
        with (self.root / name).open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                yield chunk

    def open(self, name: str) -> Any:
        return (self.root / name).open("rb")

    def names(self, under: str) -> list[str]:
        """Relative names of the files below folder `under`."""
        base = self.root / under
        return [p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file()] if base.is_dir() else []

    def write_stream(self, name: str, stream: Any) -> None:
        """Copy a binary stream into `name`, atomically (a reader never sees a partial file)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".tmp-{name}-")
        try:
            with os.fdopen(fd, "wb") as fh:
                while chunk := stream.read(_CHUNK):
                    fh.write(chunk)
            os.replace(tmp, self.root / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def write_text(self, name: str, text: str) -> None:
        """Atomically (a concurrent lister reads the old file or the new one)."""
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".tmp-{name}-")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, self.root / name)


class _S3Folder:
    """The same on `s3://bucket/prefix` with the control plane's AWS credentials."""

    def __init__(self, location: str) -> None:
        import boto3
        from botocore.config import Config

        bucket, _, prefix = location[5:].partition("/")
        self.bucket, self.prefix = bucket, f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        endpoint = tunable("SPOTPIPE_S3_ENDPOINT_URL") or None
        # Short connect timeout and few retries: a page or a listing should fail fast, not hang.
        config = Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
        self.client = boto3.client("s3", region_name=tunable("SPOTPIPE_AWS_REGION"),
                                   endpoint_url=endpoint, config=config)

    def _missing(self, exc: Exception) -> bool:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        return code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket")

    def read_text(self, name: str) -> str | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read().decode()
        except self.client.exceptions.ClientError as exc:
            if self._missing(exc):
                return None
            raise

    def stat(self, name: str) -> tuple[int, str] | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.prefix + name)
        except self.client.exceptions.ClientError as exc:
            if self._missing(exc):
                return None
            raise
        return int(head["ContentLength"]), str(head.get("ETag", ""))

    def chunks(self, name: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"]
        yield from body.iter_chunks(_CHUNK)

    def open(self, name: str) -> Any:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"]

    def names(self, under: str) -> list[str]:
        """Relative names of the objects below `under/`."""
        found: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                      Prefix=f"{self.prefix}{under}/")
        for page in pages:
            found += [obj["Key"][len(self.prefix):] for obj in page.get("Contents", [])]
        return found

    def write_stream(self, name: str, stream: Any) -> None:
        self.client.upload_fileobj(stream, self.bucket, self.prefix + name)

    def write_text(self, name: str, text: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=text.encode(),
                               ContentType="application/json")


def store_folder(location: str) -> _LocalFolder | _S3Folder:
    """A folder of the artifact store (local or s3://) to read, stat, stream and write files in."""
    return _S3Folder(location) if location.startswith("s3://") else _LocalFolder(location)


def _export_files(folder: _LocalFolder | _S3Folder) -> list[str] | None:
    """The names of the export's files, as a reader sees them (`runtime.checkpointing.export.WeightsFolder`: an
    index, when there is one, and the shards it names; else the single file), plus spotpipe.json;
    None until the model's index or single file is in place (writers put it last). Driven by the
    indexes, so a stale shard of an older export in the same folder is not listed."""
    names: list[str] = []
    for prefix in ("model", "optimizer"):
        index_name, single = f"{prefix}.safetensors.index.json", f"{prefix}.safetensors"
        text = folder.read_text(index_name)
        if text is not None:
            try:
                shards = sorted(set(json.loads(text)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                return None  # being replaced, or not an index: not complete
            names += [index_name, *shards]
        elif folder.stat(single) is not None:
            names.append(single)
        elif prefix == "model":
            return None
    names.append("spotpipe.json")
    if folder.stat(f"{HF_FOLDER}/{CONFIG}") is not None:  # written last: the Hugging Face folder is whole
        names += [f"{HF_FOLDER}/{name}" for name in HF_FILES]
    return names


def _sha256(folder: _LocalFolder | _S3Folder, name: str) -> str:
    digest = hashlib.sha256()
    for chunk in folder.chunks(name):
        digest.update(chunk)
    return digest.hexdigest()


def _read_sidecar(folder: _LocalFolder | _S3Folder) -> dict[str, Any]:
    try:
        body = json.loads(folder.read_text(SIDECAR) or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def job_latest_checkpoint(*, job: TrainingJob) -> int | None:
    """The step of the newest complete checkpoint in the job's folder (`checkpoints/step-N/`, what
    its workers restore from when every copy of a stage is lost), or None when there is none or the
    store cannot be listed (logged: the job then fails as it would without a checkpoint)."""
    try:
        steps = complete_steps(store_folder(job_artifacts_location(job=job)).names(CHECKPOINTS))
    except (OSError, BotoCoreError, ClientError) as exc:  # S3 unreachable, credentials, permissions
        logger.warning("job %s: checkpoints not listed: %s", job.pk, exc)
        return None
    return steps[-1] if steps else None


def job_checkpoint_location(*, job: TrainingJob, step: int) -> str:
    """The folder of the job's checkpoint of `step` (an export a run can start from: `init_from`)."""
    return f"{job_artifacts_location(job=job).rstrip('/')}/{CHECKPOINTS}/step-{step}"


def job_artifact_list(*, job: TrainingJob) -> list[Artifact]:
    """The job's weight files (empty until its export is complete), each with its size and sha256
    (computed once per file version, then read from the sidecar)."""
    folder = store_folder(job_artifacts_location(job=job))
    names = _export_files(folder)
    if names is None:
        return []
    cached = _read_sidecar(folder)
    fresh: dict[str, Any] = {}
    artifacts = []
    for name in sorted(set(names)):
        # Only the export's own names (an index could name anything), regular files, no links.
        stat = folder.stat(name) if ARTIFACT_NAME.fullmatch(name) else None
        if stat is None:
            continue
        size, version = stat
        known = cached.get(name) or {}
        if known.get("size") == size and known.get("version") == version and known.get("sha256"):
            sha = known["sha256"]
        else:
            sha = _sha256(folder, name)
        fresh[name] = {"size": size, "version": version, "sha256": sha}
        artifacts.append(Artifact(name, size, sha, version))
    if fresh != cached:
        with contextlib.suppress(Exception):  # a cache: best effort
            folder.write_text(SIDECAR, json.dumps(fresh, indent=1, sort_keys=True))
    return artifacts


def job_artifact_get(*, job: TrainingJob, name: str) -> Artifact:
    """One of the job's listed files by name; Http404 for any name the listing does not have (so no
    path outside the job's folder can be asked for)."""
    for artifact in job_artifact_list(job=job):
        if artifact.name == name:
            return artifact
    raise Http404(f"job {job.pk} has no artifact {name!r}")


def job_artifact_open(*, job: TrainingJob, name: str) -> tuple[Artifact, Any]:
    """A listed file and an open binary stream of it (a file, or the S3 object's body)."""
    artifact = job_artifact_get(job=job, name=name)
    return artifact, store_folder(job_artifacts_location(job=job)).open(name)


def job_artifacts_summary(*, job: TrainingJob, base_url: str = "") -> dict[str, Any]:
    """The API's (and the job page's) view of the job's artifacts: where they are, whether the export
    is complete, the files and the lines that load them."""
    files = job_artifact_list(job=job)
    location = job_artifacts_location(job=job)
    return {
        "location": location,
        "complete": bool(files),
        "files": [
            {"name": a.name, "size": a.size, "sha256": a.sha256,
             "url": f"{base_url}/api/v1/jobs/{job.pk}/artifacts/{a.name}"}
            for a in files
        ],
        "load_snippet": load_snippet(location),
    }


def load_snippet(location: str) -> str:
    """Three lines that load the job's weights (`spotpipe.load_model`)."""
    return "\n".join([
        "import spotpipe",
        f"model = spotpipe.load_model({json.dumps(location)})  # nn.Sequential, eval mode",
        "print(model)",
    ])
