"""Which places of the artifact store a job's contract may name.

Every team's weights, checkpoints and packages share one store (`SPOTPIPE_ARTIFACTS`), read and
written by the nodes with the store's credentials. A contract names places the nodes read or write
(`data.source`, `data.tokenizer`, `data.prepare`, `init_from`, `checkpoint_dir`, `s3://`
requirements): inside the store, only a folder of one of the submitting team's own jobs
(`job-<id>-<key>/...`, `jobs.artifacts.job_artifacts_location`) may be named. Anything else there,
another team's job, the packages, the store's root or a glob over it, is refused at submit, before
anything looks at the store, so the answer never tells whether another team's folder exists.

What this does not do: give each job credentials scoped to its own folder. A team's code on its
nodes runs with the nodes' credentials (an instance profile, or `SPOTPIPE_LOCAL_NODE_ENV`), so an
operator who hosts teams that must not read each other's weights gives each team its own store
credentials at the cloud (docs/api.md, "The job's data").
"""

from __future__ import annotations

import os
import re
from typing import Any

from controlplane.jobs.artifacts import artifact_store
from controlplane.jobs.models import TrainingJob
from runtime.config import JobConfig, parse_source

# A job's folder in the store: `job-<id>-<key>`, or `job-<id>` for jobs older than the key.
_JOB_FOLDER = re.compile(r"job-(?P<id>\d{1,18})(?:-(?P<key>[0-9a-f]{1,16}))?")


def _named_places(config: JobConfig) -> list[tuple[str, str]]:
    """(request field, location) of every place the contract has the nodes read or write."""
    places = []
    data = config.data
    if data.source:
        source = parse_source(data.source)
        if source.format != "py":
            places.append(("config.data.source", source.location))
    places += [(f"config.{name}", value) for name, value in (
        ("data.tokenizer", data.tokenizer if data.tokenizer != "byte" else ""), ("data.prepare", data.prepare),
        ("init_from", config.init_from), ("checkpoint_dir", config.checkpoint_dir)) if value]
    places += [(f"config.requirements[{i}]", entry) for i, entry in enumerate(config.requirements)
               if entry.startswith("s3://")]
    return places


def _inside_store(location: str, store: str) -> str | None:
    """The part of `location` below the store's root ("" for the root itself), or None when it is
    not in the store. S3 keys compare as written (S3 keys are not paths); local paths as the nodes
    of this host resolve them (relative to the working folder), without following links."""
    if store.startswith("s3://"):
        if not location.startswith("s3://"):
            return None
        store_bucket, _, store_prefix = store[5:].partition("/")
        bucket, _, key = location[5:].partition("/")
        store_prefix = store_prefix.strip("/")
        if bucket.lower() != store_bucket.lower():
            return None
        if not store_prefix:
            return key
        if key.rstrip("/") == store_prefix:
            return ""
        return key[len(store_prefix) + 1:] if key.startswith(f"{store_prefix}/") else None
    if "://" in location:
        return None
    root, path = os.path.abspath(store), os.path.abspath(location)
    if path == root:
        return ""
    return os.path.relpath(path, root) if path.startswith(root.rstrip(os.sep) + os.sep) else None


def _own_job_folder(rest: str, *, team: Any) -> bool:
    folder = _JOB_FOLDER.fullmatch(rest.replace(os.sep, "/").split("/", 1)[0])
    if folder is None:
        return False
    job = TrainingJob.objects.filter(pk=int(folder["id"]), team=team).only("artifacts_key").first()
    return job is not None and (job.artifacts_key or None) == folder["key"]


def store_access_errors(config: JobConfig, *, team: Any) -> dict[str, list[str]]:
    """Request field -> problem, for each place of `config` inside the artifact store that is not
    within a folder of one of `team`'s jobs."""
    store = artifact_store()
    errors: dict[str, list[str]] = {}
    for name, location in _named_places(config):
        rest = _inside_store(location, store)
        if rest is not None and not _own_job_folder(rest, team=team):
            errors[name] = [f"{location} is in the artifact store, outside your team's jobs' folders; name a "
                            "folder of one of your own jobs (its artifacts location), or a place outside the store"]
    return errors
