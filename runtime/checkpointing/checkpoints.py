"""Checkpoints, in the weights-out format: a checkpoint of step N is an export (`runtime.checkpointing.export`) at
`<root>/checkpoints/step-N/` -- weights, optimizer state and spotpipe.json, Hugging Face sharded
safetensors -- written by the layers' designated writers like the final export. It is complete when
its model index exists (or, written by a single writer in one shard, its `model.safetensors`), which
the last writer to finish writes; the newest complete one is the restore point. So a checkpoint
folder loads with `spotpipe.load_model`, and a job can start from one with `init_from`.

The root is the job's export dir when it has one (local or `s3://`), else `checkpoint_dir`, else a
per-job temporary folder (`checkpoint_root`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from runtime.checkpointing.durability import CHECKPOINTS, complete_steps
from runtime.checkpointing.export import DEFAULT_SHARD_BYTES, InitialState, export_layers, model_entry
from runtime.config import ModelSpec

KEEP = 2
"""Complete checkpoints kept. Two, not one: the newest is the restore point, and the one before it
is a fallback should the newest prove unreadable (an object lost, a torn file on a local disk that
lost power), at the cost of one more checkpoint of storage."""


def checkpoint_root(*, export_dir: str, checkpoint_dir: str, out_dir: str, job_id: str) -> str:
    """Where a job's checkpoints go: its export dir, else `checkpoint_dir`, else `<out_dir or
    /tmp>/ckpt-<job>` (a local folder of that run only)."""
    if export_dir:
        return export_dir
    if checkpoint_dir:
        return checkpoint_dir
    return str(Path(out_dir or "/tmp") / f"ckpt-{job_id}")


class Checkpoints:
    """The checkpoints under one root (local folder or `s3://bucket/prefix`)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._readers: dict[int, InitialState] = {}

    @property
    def on_s3(self) -> bool:
        return self.root.startswith("s3://")

    def step_dir(self, step: int) -> str:
        """The folder of the checkpoint of `step`."""
        return f"{self.root}/{CHECKPOINTS}/step-{step}"

    # -- finding them --------------------------------------------------------------------------
    def _s3(self) -> tuple[Any, str, str]:
        import boto3

        bucket, _, prefix = self.root[5:].partition("/")
        prefix = prefix.strip("/")
        return boto3.client("s3"), bucket, f"{prefix}/{CHECKPOINTS}/" if prefix else f"{CHECKPOINTS}/"

    def _s3_keys(self, under: str = "") -> list[str]:
        client, bucket, prefix = self._s3()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + under):
            keys += [obj["Key"] for obj in page.get("Contents", [])]
        return keys

    def complete_steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first (`runtime.checkpointing.durability.complete_steps`)."""
        if self.on_s3:
            return complete_steps(self._s3_keys())
        names: list[str] = []
        for folder in (Path(self.root) / CHECKPOINTS).glob("step-*"):
            try:
                files = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue  # pruned by another writer while we listed (a glob over both levels raised here)
            names += [f"{CHECKPOINTS}/{folder.name}/{f}" for f in files if f.startswith("model.safetensors")]
        return complete_steps(names)

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, if any."""
        steps = self.complete_steps()
        return steps[-1] if steps else None

    # -- writing ---------------------------------------------------------------------------------
    def write(self, step: int, *, spec: ModelSpec, layers: Mapping[int, nn.Module], writers: Mapping[int, int],
              node: int, states: Mapping[int, Any], export_id: str, info: Mapping[str, Any],
              max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> bool:
        """This node's shards of the checkpoint of `step` (`export_layers`: `layers`, every layer of
        the model `spec`, give the shard plan its shapes; meta ones do); True when this node saw
        it complete. `export_id` must differ between attempts at the same step (e.g. name the
        generation), so shards left by an attempt that died are never counted as this one's.

        Pruning lists the whole store, so at most two writers do it per checkpoint (the one that
        completed it, and layer 0's writer, which prunes even where checkpoints never complete):
        with every writer pruning, 1,024 writers would list the same prefix 1,024 times."""
        body = {"model": model_entry(spec), **info, "steps_done": step}  # loadable by `spotpipe.load_model`
        complete = export_layers(self.step_dir(step), layers=layers, writers=writers, node=node, states=states,
                                 steps_done=step, export_id=export_id, info=body, max_shard_bytes=max_shard_bytes)
        if complete or writers.get(0) == node:
            self.prune()
        return complete

    def prune(self) -> None:
        """Keep the `KEEP` newest complete checkpoints and the `KEEP` newest folders (complete or
        being written); delete the rest. Incomplete folders go too, so a root that never sees one
        complete (writers on several machines each given a local folder) does not fill the disk."""
        steps = self._all_steps()
        keep = set(self.complete_steps()[-KEEP:]) | set(steps[-KEEP:])
        for step in steps:
            if step not in keep:
                self._remove(step)

    def _all_steps(self) -> list[int]:
        if self.on_s3:
            return sorted({int(m.group(1)) for key in self._s3_keys() if (m := re.search(r"step-(\d+)/", key))})
        base = Path(self.root) / CHECKPOINTS
        return sorted(int(d.name[5:]) for d in base.glob("step-*") if d.name[5:].isdigit())

    def _remove(self, step: int) -> None:
        if not self.on_s3:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)  # another writer may prune it too
            return
        client, bucket, _ = self._s3()
        keys = self._s3_keys(f"step-{step}/")
        for at in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[at:at + 1000]]})

    # -- reading ---------------------------------------------------------------------------------
    def load(self, step: int, state: Any) -> None:
        """Load layer `state.index` (parameters, AdamW moments, version) from the checkpoint of
        `step` into a `LayerState`, as `init_from` does (one reader per step, so an S3 checkpoint is
        downloaded once)."""
        self.reader(step).apply(state)

    def reader(self, step: int) -> InitialState:
        """The checkpoint of `step` as an `InitialState` (read once per step)."""
        if step not in self._readers:
            self._readers[step] = InitialState(self.step_dir(step))
        return self._readers[step]
