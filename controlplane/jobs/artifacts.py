"""A job's artifacts: the final weights its workers export (runtime/export.py) into the job's folder
of the artifact store (`SPOTPIPE_ARTIFACTS`, `<store>/job-<id>/`), listed and served by the API.

The control plane hands the folder to the agents in the `run` command (`job.artifacts`); every
worker of the final layout writes its shards there at the end of the job, the last one the index
(so a listing never names a file that is not whole). Checksums are computed once per file and kept
in a sidecar (`.sha256.json`, keyed by name, size and modification time) in the same folder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import Http404

from controlplane.jobs.models import TrainingJob

SIDECAR = ".sha256.json"
# What a job's folder may hold that the API serves: the export's weight files, its optimizer state,
# their indexes and spotpipe.json. Nothing else (temporary files, the sidecar) is listed or served.
ARTIFACT_NAME = re.compile(
    r"(model|optimizer)(-\d{5}-of-\d{5})?\.safetensors|(model|optimizer)\.safetensors\.index\.json|spotpipe\.json"
)
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Artifact:
    name: str
    size: int
    sha256: str
    path: Path


def artifact_store() -> str:
    """The artifact store's root (a local folder)."""
    return str(settings.SPOTPIPE_ARTIFACTS)


def job_artifacts_location(*, job: TrainingJob | int) -> str:
    """The job's folder in the artifact store: what its workers get as their export folder."""
    job_id = job if isinstance(job, int) else job.pk
    return str(Path(artifact_store()) / f"job-{job_id}")


def _export_files(folder: Path) -> list[str] | None:
    """The names of the export's files in `folder`, as a reader sees them (`runtime.export.WeightsFolder`:
    an index, when there is one, and the shards it names; else the single file), plus spotpipe.json;
    None until the model's index or single file is in place (writers put it last). Driven by the
    indexes, so a stale shard of an older export in the same folder is not listed."""
    names: list[str] = []
    for prefix in ("model", "optimizer"):
        index, single = folder / f"{prefix}.safetensors.index.json", folder / f"{prefix}.safetensors"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return None  # being replaced, or not an index: not complete
            names += [index.name, *shards]
        elif single.is_file():
            names.append(single.name)
        elif prefix == "model":
            return None
    names.append("spotpipe.json")
    return names


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_sidecar(folder: Path) -> dict[str, Any]:
    try:
        body = json.loads((folder / SIDECAR).read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _write_sidecar(folder: Path, body: dict[str, Any]) -> None:
    """Atomically (a concurrent lister reads the old sidecar or the new one); best effort."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{SIDECAR}-")
        with os.fdopen(fd, "w") as fh:
            json.dump(body, fh, indent=1, sort_keys=True)
        os.replace(tmp, folder / SIDECAR)
    except OSError:
        pass


def job_artifact_list(*, job: TrainingJob) -> list[Artifact]:
    """The job's weight files (empty until its export is complete), each with its size and sha256
    (computed once per file version, then read from the sidecar)."""
    folder = Path(job_artifacts_location(job=job))
    names = _export_files(folder) if folder.is_dir() else None
    if names is None:
        return []
    cached = _read_sidecar(folder)
    fresh: dict[str, Any] = {}
    artifacts = []
    for name in sorted(set(names)):
        path = folder / name
        # Only the export's own names (an index could name anything), regular files, no links.
        if not ARTIFACT_NAME.fullmatch(name) or path.is_symlink() or not path.is_file():
            continue
        stat = path.stat()
        known = cached.get(name) or {}
        if known.get("size") == stat.st_size and known.get("mtime_ns") == stat.st_mtime_ns and known.get("sha256"):
            sha = known["sha256"]
        else:
            sha = _sha256(path)
        fresh[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha}
        artifacts.append(Artifact(name, stat.st_size, sha, path))
    if fresh != cached:
        _write_sidecar(folder, fresh)
    return artifacts


def job_artifact_get(*, job: TrainingJob, name: str) -> Artifact:
    """One of the job's listed files by name; Http404 for any name the listing does not have (so no
    path outside the job's folder can be asked for)."""
    for artifact in job_artifact_list(job=job):
        if artifact.name == name:
            return artifact
    raise Http404(f"job {job.pk} has no artifact {name!r}")


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
