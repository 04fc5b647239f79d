"""Where checkpoints live: a local directory or S3 (boto3), behind one small interface.

A checkpoint of step t is one object per layer (`step-{t}/layer-{i}.pt`, the layer's flat state)
plus a `step-{t}/COMPLETE` marker written only after every layer is known to be saved (after the
step committed), so a crash mid-save never produces a checkpoint that looks usable.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

import torch


class CheckpointStore(Protocol):
    """Storage of per-layer checkpoint objects."""

    def save_layer(self, step: int, layer: int, flat: torch.Tensor) -> None: ...
    def load_layer(self, step: int, layer: int) -> torch.Tensor: ...
    def mark_complete(self, step: int) -> None: ...
    def latest(self) -> int | None: ...


def _encode(flat: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(flat, buf)
    return buf.getvalue()


def _decode(data: bytes) -> torch.Tensor:
    return torch.load(io.BytesIO(data), weights_only=True)


class LocalCheckpointStore:
    """Checkpoints in a directory (atomic renames, so readers never see half a file)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def save_layer(self, step: int, layer: int, flat: torch.Tensor) -> None:
        """Store one layer's flat state for `step`."""
        self._write(self.root / f"step-{step}" / f"layer-{layer}.pt", _encode(flat))

    def load_layer(self, step: int, layer: int) -> torch.Tensor:
        """Read one layer's flat state of `step`."""
        return _decode((self.root / f"step-{step}" / f"layer-{layer}.pt").read_bytes())

    def mark_complete(self, step: int) -> None:
        """Declare the checkpoint of `step` usable."""
        self._write(self.root / f"step-{step}" / "COMPLETE", b"ok")

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, if any."""
        steps = [int(p.parent.name.split("-")[1]) for p in self.root.glob("step-*/COMPLETE")]
        return max(steps) if steps else None


class S3CheckpointStore:
    """Checkpoints under `s3://bucket/prefix` through boto3 (credentials from the environment)."""

    def __init__(self, bucket: str, prefix: str = "", client: object | None = None) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3")

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def save_layer(self, step: int, layer: int, flat: torch.Tensor) -> None:
        """Store one layer's flat state for `step`."""
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(f"step-{step}", f"layer-{layer}.pt"), Body=_encode(flat)
        )

    def load_layer(self, step: int, layer: int) -> torch.Tensor:
        """Read one layer's flat state of `step`."""
        obj = self.client.get_object(Bucket=self.bucket, Key=self._key(f"step-{step}", f"layer-{layer}.pt"))
        return _decode(obj["Body"].read())

    def mark_complete(self, step: int) -> None:
        """Declare the checkpoint of `step` usable."""
        self.client.put_object(Bucket=self.bucket, Key=self._key(f"step-{step}", "COMPLETE"), Body=b"ok")

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, if any (paged listing)."""
        steps = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("step-")):
            for obj in page.get("Contents", []):
                found = re.search(r"step-(\d+)/COMPLETE$", obj["Key"])
                if found:
                    steps.append(int(found.group(1)))
        return max(steps) if steps else None


def open_checkpoint_store(location: str) -> CheckpointStore:
    """`s3://bucket/prefix` or a local path."""
    if location.startswith("s3://"):
        bucket, _, prefix = location[5:].partition("/")
        return S3CheckpointStore(bucket, prefix)
    return LocalCheckpointStore(location)
