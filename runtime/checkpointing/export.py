"""Weights out: a job's parameters (and optionally its optimizer state) as safetensors, read back.

The layout is Hugging Face's sharded safetensors layout, so any tool that reads a Hugging Face
checkpoint folder reads ours:

- `model.safetensors` when one writer holds every tensor and they fit one shard, else
  `model-00001-of-0000n.safetensors` ... plus `model.safetensors.index.json`
  (`{"metadata": {"total_size": BYTES, "steps_done": N}, "weight_map": {key: file}}`);
- keys as in the state dict of the whole `nn.Sequential` (`0.wte.weight`, `3.c_attn.weight`, ...);
- `optimizer*.safetensors` (same rule, optional): for every parameter key `K`, `K.exp_avg` and
  `K.exp_avg_sq` (the AdamW moments), and `{layer}.version` (int64: optimizer steps applied);
- `spotpipe.json` beside them: at least `model` (what `build_model` needs), `config` and `steps_done`.

Distributed writing: every node computes the same shard plan from the final layout (which node is
the designated writer of which layer: the first owner of each owner run, as checkpoints do) and
the layers' shapes, writes only its own shards (a shard never mixes writers), each atomically (a
temporary file, then `os.replace`). The index is written last, by whichever writer finds every
shard of this export present (each shard's metadata names its export, so a stale file of an older
export in the same folder does not count): of the writers, the last to finish always does. So a
reader never sees an index that points at a missing file.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from runtime.config import ModelSpec

MODEL = "model"
OPTIMIZER = "optimizer"
INFO = "spotpipe.json"
DEFAULT_SHARD_BYTES = 2 * 10**9
"""Largest shard (bytes of tensor data) before a writer's tensors go to a next shard (2 GB)."""


class ExportError(ValueError):
    """A weights folder that cannot be read or does not fit the model; the message says why."""


# --- what goes into an export ------------------------------------------------------------------


def layer_tensors(index: int, module: nn.Module) -> dict[str, torch.Tensor]:
    """Layer `index`'s entries of the whole model's state dict (`{index}.{name}`)."""
    return {f"{index}.{name}": t.detach() for name, t in module.state_dict().items()}


def optimizer_tensors(state: Any) -> dict[str, torch.Tensor]:
    """A `LayerState`'s AdamW moments and version, keyed after its parameters."""
    out: dict[str, torch.Tensor] = {}
    names = [name for name, _ in state.module.named_parameters()]
    for name, m, v in zip(names, state.exp_avg, state.exp_avg_sq, strict=True):
        out[f"{state.index}.{name}.exp_avg"] = m
        out[f"{state.index}.{name}.exp_avg_sq"] = v
    out[f"{state.index}.version"] = torch.tensor(state.version, dtype=torch.int64)
    return out


def model_entry(spec: ModelSpec) -> dict[str, Any]:
    """The `model` entry of spotpipe.json: what `runtime.models.load.build_from_entry` rebuilds the module from.

    It is the ModelSpec dict with its kind's fields only (`ModelSpec.to_dict`): a user model's import
    path, kwargs, loss, layer count and declared context and vocabulary; no GPT fields on it."""
    return spec.to_dict()


def spec_of_entry(entry: Mapping[str, Any]) -> ModelSpec:
    """The `ModelSpec` of a spotpipe.json `model` entry (keys it does not know are left out)."""
    return ModelSpec(**{k: v for k, v in entry.items() if k in ModelSpec.__dataclass_fields__})


# --- the shard plan -----------------------------------------------------------------------------


@dataclass(slots=True)
class ShardPlan:
    """Which keys go to which file, and who writes it: the same on every writer."""

    prefix: str
    shards: list[tuple[int, list[str]]]
    """(writer, keys) per shard, in file order."""
    sizes: dict[str, int]

    def file(self, k: int) -> str:
        """File name of shard `k` (0-based)."""
        if len(self.shards) == 1:
            return f"{self.prefix}.safetensors"
        return f"{self.prefix}-{k + 1:05d}-of-{len(self.shards):05d}.safetensors"

    @property
    def index_file(self) -> str:
        return f"{self.prefix}.safetensors.index.json"

    def weight_map(self) -> dict[str, str]:
        return {key: self.file(k) for k, (_, keys) in enumerate(self.shards) for key in keys}


def plan_shards(prefix: str, entries: Iterable[tuple[int, str, int]],
                max_bytes: int = DEFAULT_SHARD_BYTES) -> ShardPlan:
    """Shards of `(writer, key, nbytes)` entries (in order): each writer's keys in order, a new
    shard when the next tensor would pass `max_bytes` (a tensor larger than that gets a shard of
    its own); a shard holds one writer's tensors only."""
    by_writer: dict[int, list[tuple[str, int]]] = {}
    sizes: dict[str, int] = {}
    for writer, key, nbytes in entries:
        by_writer.setdefault(writer, []).append((key, nbytes))
        sizes[key] = nbytes
    shards: list[tuple[int, list[str]]] = []
    for writer, keyed in by_writer.items():
        current: list[str] = []
        used = 0
        for key, nbytes in keyed:
            if current and used + nbytes > max_bytes:
                shards.append((writer, current))
                current, used = [], 0
            current.append(key)
            used += nbytes
        if current:
            shards.append((writer, current))
    return ShardPlan(prefix, shards, sizes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# --- writing -------------------------------------------------------------------------------------


def _atomic_write(path: Path, write: Any) -> None:
    """`write(tmp_path)`, then rename over `path`: readers see the old file or the whole new one.
    The file gets the mode the user's umask gives any new file (mkstemp's, and safetensors', is 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.name}-{os.urandom(8).hex()}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        mode = os.stat(tmp).st_mode & 0o777  # 0666 less the umask, read without changing the process's umask
        write(tmp)
        os.chmod(tmp, mode)  # a writer that replaced the file (safetensors) made it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """JSON written atomically."""
    _atomic_write(Path(path), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def write_shards(directory: str | Path, plan: ShardPlan, writer: int, tensors: Mapping[str, torch.Tensor],
                 metadata: Mapping[str, str]) -> list[str]:
    """Write the shards of `plan` that `writer` writes (each atomically); returns their file names."""
    from safetensors.torch import save_file

    directory = Path(directory)
    written = []
    for k, (owner, keys) in enumerate(plan.shards):
        if owner != writer:
            continue
        missing = [key for key in keys if key not in tensors]
        if missing:
            raise ExportError(f"writer {writer} does not hold {missing[:3]} of its shard {plan.file(k)}")
        body, storages = {}, set()
        for key in keys:
            tensor = tensors[key].detach().to("cpu").contiguous()
            storage = tensor.untyped_storage().data_ptr()
            if storage in storages:  # tied weights: each name gets its own copy (safetensors refuses shared ones)
                tensor = tensor.clone()
            storages.add(storage)
            body[key] = tensor
        _atomic_write(directory / plan.file(k), lambda tmp, b=body: save_file(b, tmp, metadata=dict(metadata)))
        written.append(plan.file(k))
    return written


def _file_export_id(path: Path) -> str | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            return (fh.metadata() or {}).get("export")
    except (OSError, ValueError, RuntimeError):  # missing, or not a (whole) safetensors file
        return None


def write_index_if_complete(directory: str | Path, plan: ShardPlan, metadata: Mapping[str, Any]) -> bool:
    """Write the index once every shard of this export (`metadata["export"]`) is in place;
    True when the export is complete (index written, or a single file that needs none)."""
    directory = Path(directory)
    export_id = str(metadata["export"])
    if any(_file_export_id(directory / plan.file(k)) != export_id for k in range(len(plan.shards))):
        return False
    if len(plan.shards) > 1:
        meta = {"total_size": sum(plan.sizes.values()), **metadata}
        write_json(directory / plan.index_file, {"metadata": meta, "weight_map": plan.weight_map()})
    return True


def export_state_dict(directory: str | Path, state: Mapping[str, torch.Tensor], *, prefix: str = MODEL,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES, steps_done: int = 0,
                      export_id: str = "") -> ShardPlan:
    """Write a whole state dict from one process (one writer): one file when it fits `max_shard_bytes`."""
    plan = plan_shards(prefix, ((0, key, _nbytes(t)) for key, t in state.items()), max_shard_bytes)
    meta = {"format": "pt", "export": export_id or os.urandom(8).hex(), "steps_done": str(steps_done)}
    write_shards(directory, plan, 0, state, meta)
    if not write_index_if_complete(directory, plan, meta):
        raise ExportError(f"export to {directory} is incomplete after writing every shard")
    return plan


def export_model(directory: str | Path, model: nn.Module, *, spec: ModelSpec | None = None,
                 max_shard_bytes: int = DEFAULT_SHARD_BYTES, info: Mapping[str, Any] | None = None) -> ShardPlan:
    """Write `model`'s state dict (and spotpipe.json with `spec` when given) from one process."""
    if spec is not None or info is not None:
        body = dict(info or {})
        if spec is not None:
            body.setdefault("model", model_entry(spec))
        write_json(Path(directory) / INFO, body)
    return export_state_dict(directory, model.state_dict(), max_shard_bytes=max_shard_bytes)


def distributed_plans(layers: Mapping[int, nn.Module], writers: Mapping[int, int], *, optimizer: bool,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict[str, ShardPlan]:
    """The model (and optimizer) shard plans of a distributed export, from shapes only: the same on
    every node. `layers`: every layer of the model (built on the meta device is enough: only the
    names and sizes of their tensors are read); `writers`: layer -> designated writer node."""
    model_entries, opt_entries = [], []
    for layer in sorted(writers):
        module, writer = layers[layer], writers[layer]
        model_entries += [(writer, key, _nbytes(t)) for key, t in layer_tensors(layer, module).items()]
        if optimizer:
            for name, p in module.named_parameters():
                for moment in ("exp_avg", "exp_avg_sq"):
                    opt_entries.append((writer, f"{layer}.{name}.{moment}", _nbytes(p)))
            opt_entries.append((writer, f"{layer}.version", 8))
    plans = {MODEL: plan_shards(MODEL, model_entries, max_shard_bytes)}
    if optimizer:
        plans[OPTIMIZER] = plan_shards(OPTIMIZER, opt_entries, max_shard_bytes)
    return plans


# --- reading -------------------------------------------------------------------------------------

_WEIGHTS_FILE = rf"(?:{MODEL}|{OPTIMIZER})(?:-\d+-of-\d+)?\.safetensors(?:\.index\.json)?"
_EXPORT_FILE = re.compile(rf"{_WEIGHTS_FILE}|\.tmp-(?:{_WEIGHTS_FILE}|{re.escape(INFO)})-.+")
"""A weights file of an export, or one being written (`_atomic_write`'s temporary name)."""


def export_files(directory: str | Path) -> list[Path]:
    """The files of an export at the top of local folder `directory`: spotpipe.json and the model
    and optimizer weights (single files, shards, indexes, half-written ones); [] when it holds none.
    What a new export there must not be mixed with (an old index would win over new shards)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name == INFO or (p.is_file() and _EXPORT_FILE.fullmatch(p.name)))


def local_folder(directory: str | Path) -> Path:
    """A local folder of `directory`: itself, or an `s3://bucket/prefix` downloaded to a temporary folder."""
    text = str(directory)
    if not text.startswith("s3://"):
        return Path(directory)
    import boto3

    bucket, _, prefix = text[5:].partition("/")
    prefix = prefix.strip("/")
    client = boto3.client("s3")
    target = Path(tempfile.mkdtemp(prefix="spotpipe-weights-"))
    paginator = client.get_paginator("list_objects_v2")
    found = False
    for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
        for obj in page.get("Contents", []):
            rest = obj["Key"][len(prefix) + 1 if prefix else 0:]
            if "/" in rest or not rest:
                continue  # only the top of the folder (checkpoints/, ranks/ are not needed)
            client.download_file(bucket, obj["Key"], str(target / rest))
            found = True
    if not found:
        raise ExportError(f"{text}: no objects under that prefix")
    return target


class WeightsFolder:
    """One export (`model` or `optimizer` prefix) in a folder, read lazily tensor by tensor."""

    def __init__(self, directory: str | Path, prefix: str = MODEL) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        index = self.directory / f"{prefix}.safetensors.index.json"
        single = self.directory / f"{prefix}.safetensors"
        if index.is_file():
            body = json.loads(index.read_text())
            self.weight_map: dict[str, str] = body["weight_map"]
            self.metadata: dict[str, Any] = body.get("metadata", {})
        elif single.is_file():
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as fh:
                self.weight_map = {key: single.name for key in fh.keys()}  # noqa: SIM118 (not a dict)
                self.metadata = dict(fh.metadata() or {})
        else:
            raise ExportError(f"{self.directory}: no {prefix}.safetensors and no {prefix}.safetensors.index.json "
                              "(not a weights folder, or its export is not complete yet)")

    @staticmethod
    def exists(directory: str | Path, prefix: str) -> bool:
        d = Path(directory)
        return (d / f"{prefix}.safetensors.index.json").is_file() or (d / f"{prefix}.safetensors").is_file()

    @property
    def steps_done(self) -> int:
        return int(self.metadata.get("steps_done", 0))

    def tensors(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """The named tensors, each file opened once; `ExportError` naming keys the folder lacks."""
        from safetensors import safe_open

        keys = list(keys)
        missing = [k for k in keys if k not in self.weight_map]
        if missing:
            raise ExportError(f"{self.directory}: {self.prefix} weights lack {missing[:5]}"
                              f"{' and more' if len(missing) > 5 else ''}")
        by_file: dict[str, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.weight_map[key], []).append(key)
        out = {}
        for name, names in by_file.items():
            with safe_open(str(self.directory / name), framework="pt") as fh:
                for key in names:
                    out[key] = fh.get_tensor(key)
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors(self.weight_map)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the files' headers (no tensor is read)."""
        from safetensors import safe_open

        out: dict[str, tuple[int, ...]] = {}
        for name in sorted(set(self.weight_map.values())):
            with safe_open(str(self.directory / name), framework="pt") as fh:
                out.update({key: tuple(fh.get_slice(key).get_shape()) for key in fh.keys()})  # noqa: SIM118
        return out


def read_info(directory: str | Path) -> dict[str, Any]:
    """The folder's spotpipe.json."""
    path = Path(directory) / INFO
    if not path.is_file():
        raise ExportError(f"{directory}: no {INFO} (it names the model to build)")
    return json.loads(path.read_text())


def model_of_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The `model` entry of a spotpipe.json (older ones have it only under `config`)."""
    entry = info.get("model") or (info.get("config") or {}).get("model")
    if not entry:
        raise ExportError(f"{INFO} has no model entry")
    return dict(entry)


# --- a distributed job's final export (called by each worker) ------------------------------------


def export_layers(directory: str | Path, *, layers: Mapping[int, nn.Module], writers: Mapping[int, int], node: int,
                  states: Mapping[int, Any], steps_done: int, export_id: str, info: Mapping[str, Any],
                  optimizer: bool = True, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                  staging: str | Path | None = None) -> bool:
    """Write this node's shards of a distributed export (`layers`: every layer of the model, for the
    shard plan's shapes, `distributed_plans`; `writers`: layer -> designated writer node; `states`:
    this node's `LayerState`s), and the indexes when this node completes the export.
    Returns True when this node saw the export complete.

    `directory` may be `s3://bucket/prefix`: the shards are written to a local staging folder
    (`staging`, else a temporary one; removed afterwards) and uploaded, in the same order and with
    the same rule for the index (`_upload_export`)."""
    if str(directory).startswith("s3://"):
        local = Path(staging) if staging is not None else Path(tempfile.mkdtemp(prefix="spotpipe-export-"))
        try:
            return _export_layers_local(local, layers=layers, writers=writers, node=node, states=states,
                                        steps_done=steps_done, export_id=export_id, info=info, optimizer=optimizer,
                                        max_shard_bytes=max_shard_bytes, upload_to=str(directory))
        finally:
            import shutil

            shutil.rmtree(local, ignore_errors=True)
    return _export_layers_local(Path(directory), layers=layers, writers=writers, node=node, states=states,
                                steps_done=steps_done, export_id=export_id, info=info, optimizer=optimizer,
                                max_shard_bytes=max_shard_bytes)


def s3_location(url: str) -> tuple[str, str]:
    """(bucket, key prefix ending in "/" or empty) of `s3://bucket/prefix`."""
    bucket, _, prefix = url[5:].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _upload_export(url: str, local: Path, *, plans: Mapping[str, ShardPlan], order: list[str], mine: list[str],
                   info: bool, metadata: Mapping[str, str]) -> bool:
    """Upload this writer's part of an export from `local` to `url` and, when every shard of this
    export is then in the bucket, the indexes: spotpipe.json first, the writer's shards (optimizer
    before model, each object tagged with the export id in its S3 metadata), then the indexes, the
    model's last. As on disk, the last writer to finish finds every shard and writes the index, so
    a reader never finds an index naming a missing object (S3 is read-after-write consistent)."""
    import boto3

    bucket, prefix = s3_location(url)
    client = boto3.client("s3")
    export_id = str(metadata["export"])
    if info:
        client.upload_file(str(local / INFO), bucket, prefix + INFO, ExtraArgs={"ContentType": "application/json"})
    for name in mine:
        client.upload_file(str(local / name), bucket, prefix + name, ExtraArgs={"Metadata": {"export": export_id}})

    def uploaded_export(name: str) -> str | None:
        try:
            return client.head_object(Bucket=bucket, Key=prefix + name).get("Metadata", {}).get("export")
        except client.exceptions.ClientError:
            return None

    for name in order:
        plan = plans[name]
        if any(uploaded_export(plan.file(k)) != export_id for k in range(len(plan.shards))):
            return False
    for name in order:  # the model's index only after the optimizer's
        plan = plans[name]
        if len(plan.shards) > 1:
            body = {"metadata": {"total_size": sum(plan.sizes.values()), **metadata}, "weight_map": plan.weight_map()}
            client.put_object(Bucket=bucket, Key=prefix + plan.index_file, ContentType="application/json",
                              Body=(json.dumps(body, indent=2) + "\n").encode())
    return True


def _export_layers_local(directory: Path, *, layers: Mapping[int, nn.Module], writers: Mapping[int, int], node: int,
                         states: Mapping[int, Any], steps_done: int, export_id: str, info: Mapping[str, Any],
                         optimizer: bool, max_shard_bytes: int, upload_to: str | None = None) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    plans = distributed_plans(layers, writers, optimizer=optimizer, max_shard_bytes=max_shard_bytes)
    mine = [layer for layer, w in writers.items() if w == node]
    if mine:
        write_json(directory / INFO, dict(info))  # every writer: the same content, before any index
    meta = {"format": "pt", "export": export_id, "steps_done": str(steps_done)}
    tensors: dict[str, torch.Tensor] = {}
    opt: dict[str, torch.Tensor] = {}
    for layer in mine:
        tensors.update(layer_tensors(layer, states[layer].module))
        if optimizer:
            opt.update(optimizer_tensors(states[layer]))
    # Every writer writes its optimizer shards before its model shards, so once the model's shards
    # are all in place the optimizer's are too: a reader that finds the model's index finds the
    # optimizer's (when the export has one).
    order = [OPTIMIZER, MODEL] if optimizer else [MODEL]
    written: list[str] = []
    for prefix in order:
        written += write_shards(directory, plans[prefix], node, opt if prefix == OPTIMIZER else tensors, meta)
    if upload_to is not None:
        return _upload_export(upload_to, directory, plans=plans, order=order, mine=written, info=bool(mine),
                              metadata=meta)
    complete = True
    for prefix in order:  # the model's index only after the optimizer's
        complete = complete and write_index_if_complete(directory, plans[prefix], meta)
    return complete


class Weights(Protocol):
    """What reads a folder's weights under our state-dict keys: a `WeightsFolder`, or the reader of
    a folder in another layout (`runtime.models.hf_gpt2.HFGPT2Weights`)."""

    def tensors(self, keys: Iterable[str]) -> dict[str, torch.Tensor]: ...


class InitialState:
    """The weights (and optimizer state, when the folder has it) a job starts from (`init_from`, or
    a checkpoint it restores): a spotpipe export, or a folder in another layout that `foreign` reads
    (weights only; which folders those are is `runtime.models.load.initial_state`'s).

    With optimizer state the job continues the exported one: its layers get the moments and
    versions, and training resumes at the export's `steps_done` (`start_step`), so the data order
    and the learning-rate step continue; with weights only it fine-tunes from step 0."""

    def __init__(self, directory: str | Path, foreign: Callable[[Path], Weights | None] | None = None) -> None:
        """`foreign(local folder)`: the reader of a folder that is not a spotpipe export, None for one that is."""
        local = local_folder(directory)
        if not Path(local).is_dir():
            raise ExportError(f"init_from {str(directory)!r} is not a folder; expected a folder of weights "
                              "that a spotpipe job wrote (model*.safetensors) or a Hugging Face GPT-2 folder")
        self.directory = str(directory)
        self.local = Path(local)
        """The folder on this machine (an S3 export's download)."""
        self.optimizer: WeightsFolder | None = None
        reader = foreign(self.local) if foreign is not None else None
        if reader is not None:  # weights only, under our names
            self.weights: Weights = reader
            return
        self.weights = WeightsFolder(local)
        if WeightsFolder.exists(local, OPTIMIZER):
            self.optimizer = WeightsFolder(local, OPTIMIZER)

    @property
    def start_step(self) -> int:
        return self.optimizer.steps_done if self.optimizer is not None else 0

    @property
    def skipped_at(self) -> list[int]:
        """The steps before `start_step` that the exporting job skipped (non-finite gradients): the
        history its fp16 loss scale continues from (`runtime.train.loss_scale`); none for weights only."""
        if self.optimizer is None:
            return []
        info = read_info(self.local)
        return [int(s) for s in info.get("skipped_steps_at", []) if int(s) < self.start_step]

    def check_fits(self, layers: Mapping[int, nn.Module]) -> None:
        """Refuse weights that do not fit the model whose layers are `layers` (meta ones do: only
        names and shapes are read), before any process starts: `ExportError` naming the keys the
        folder lacks and the first shapes that differ. A folder in another layout was checked by
        its reader (`foreign`)."""
        if not isinstance(self.weights, WeightsFolder):
            return
        found = self.weights.shapes()
        expected = {key: tuple(t.shape) for i, module in layers.items() for key, t in layer_tensors(i, module).items()}
        missing = [key for key in expected if key not in found]
        differ = [f"{key} is {found[key]}, the model's {shape}" for key, shape in expected.items()
                  if key in found and found[key] != shape]
        if missing or differ:
            problems = ([f"it lacks {missing[:3]}{' and more' if len(missing) > 3 else ''}"] if missing else [])
            problems += [f"{', '.join(differ[:3])}{' and more' if len(differ) > 3 else ''}"] if differ else []
            raise ExportError(f"init_from {self.directory} holds weights of another model ({'; '.join(problems)}); "
                              "expected a weights folder of this model (the same model function or preset, "
                              "with the same arguments)")

    def apply(self, state: Any) -> None:
        """Load layer `state.index`'s parameters (and moments and version) into a `LayerState`."""
        i = state.index
        expected = layer_tensors(i, state.module)
        found = self.weights.tensors(expected)
        for key, t in expected.items():
            if found[key].shape != t.shape:
                raise ExportError(f"init_from {self.directory}: {key} has shape {tuple(found[key].shape)}; "
                                  f"the model's is {tuple(t.shape)}")
            with torch.no_grad():
                t.copy_(found[key])
        if self.optimizer is not None:
            moments = optimizer_tensors(state)
            loaded = self.optimizer.tensors(moments)
            for key, t in moments.items():
                if key.endswith(".version"):
                    state.version = int(loaded[key])
                else:
                    t.copy_(loaded[key])
