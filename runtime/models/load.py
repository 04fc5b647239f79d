"""Loading from a folder of weights: which folders spotpipe reads (its own export, or a Hugging Face
GPT-2 folder, `runtime.models.hf_gpt2`) and what it builds from them: the trained model
(`load_model`, what `spotpipe.load_model` is) or the state a job starts from (`initial_state`,
`init_from`). The folder's format is `runtime.checkpointing.export`'s; building the model is this
layer's (`runtime.models.model`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runtime.checkpointing.export import (
    ExportError,
    InitialState,
    WeightsFolder,
    local_folder,
    model_entry,
    model_of_info,
    read_info,
    spec_of_entry,
)
from runtime.config import ModelSpec
from runtime.models.hf_gpt2 import HFGPT2Weights, is_hf_gpt2, read_config, spec_of_hf
from runtime.models.model import build_layer, build_model


def build_from_entry(entry: Mapping[str, Any]) -> nn.Sequential:
    """The (untrained) `nn.Sequential` of a spotpipe.json `model` entry, built on the meta device
    (no memory, no initialisation: the weights are assigned when loaded)."""
    # A user model (kind "py") is built by its function through build_layer, like on the nodes.
    spec = spec_of_entry(entry)
    spec.validate()
    with torch.device("meta"):
        return build_model(spec, 0)


def load_state_into(model: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Assign `state` to `model` (meta or not), checking keys and shapes with one clear message."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    shapes = [f"{k}: {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
              if k in state and state[k].shape != v.shape]
    if missing or extra or shapes:
        raise ExportError(f"{where} does not fit the model: missing {missing[:5]}, unexpected {extra[:5]}, "
                          f"shapes (weights vs model) {shapes[:5]}")
    model.load_state_dict(dict(state), strict=True, assign=True)


def load_model(directory: str | Path) -> nn.Sequential:
    """The trained `nn.Sequential` of a weights folder (local or `s3://bucket/prefix`), in eval mode:
    spotpipe's own layout, or a Hugging Face GPT-2 folder (`runtime.models.hf_gpt2`).

    Needs only torch, safetensors and the model function (the built-in GPT/MLP from spotpipe.json's
    `model` entry). The model is built on the meta device and the weights assigned; a layer holding
    what the weights do not (a non-persistent buffer such as a causal mask, a plain tensor attribute)
    or weights tied inside it is built for real, as the nodes build it (the job's seed), and the
    weights copied into it."""
    local = local_folder(directory)
    if is_hf_gpt2(local):
        return load_hf_gpt2(local)  # `spotpipe train --export hf`'s folder, or any GPT-2 transformers wrote
    info = read_info(local)
    entry = model_of_info(info)
    model = build_from_entry(entry)
    state = WeightsFolder(local).state_dict()
    tied = _layers_with_tied_tensors(model)
    load_state_into(model, state, str(directory))
    rebuild = sorted(tied | _layers_left_on_meta(model))
    if rebuild:
        seed = int((info.get("config") or {}).get("seed") or 0)
        _build_for_real(model, rebuild, entry=entry, seed=seed, state=state, where=str(directory))
    return model.eval()


def _layer_tensors(layer: nn.Module) -> list[torch.Tensor]:
    """Every tensor a layer holds: parameters, buffers (persistent or not) and tensor attributes."""
    found = [*layer.parameters(), *layer.buffers()]
    for module in layer.modules():
        found += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    return found


def _layers_left_on_meta(model: nn.Sequential) -> set[int]:
    return {i for i, layer in enumerate(model) if any(t.is_meta for t in _layer_tensors(layer))}


def _layers_with_tied_tensors(model: nn.Sequential) -> set[int]:
    """Layers with one parameter under two names (assigning the weights would untie it)."""
    tied = set()
    for i, layer in enumerate(model):
        params = [id(p) for _, p in layer.named_parameters(remove_duplicate=False)]
        if len(params) != len(set(params)):
            tied.add(i)
    return tied


def _build_for_real(model: nn.Sequential, indexes: list[int], *, entry: Mapping[str, Any], seed: int,
                    state: Mapping[str, torch.Tensor], where: str) -> None:
    spec = spec_of_entry(entry)
    with torch.device("cpu"):
        for i in indexes:
            layer = build_layer(spec, i, seed)
            prefix = f"{i}."
            mine = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            try:
                layer.load_state_dict(mine, strict=True)
            except RuntimeError as exc:
                raise ExportError(f"{where}: layer {i} built for real does not take its weights: {exc}") from None
            model[i] = layer


def load_hf_gpt2(directory: str | Path) -> nn.Sequential:
    """A Hugging Face GPT-2 folder as our `nn.Sequential` (what `load_model` gives for one)."""
    spec = spec_of_hf(read_config(directory))
    weights = HFGPT2Weights(directory, spec)
    model = build_from_entry(model_entry(spec))
    load_state_into(model, weights.tensors(weights.map), str(directory))
    return model.eval()


def initial_state(directory: str | Path, spec: ModelSpec) -> InitialState:
    """The state a job of model `spec` starts from (`init_from`): a spotpipe export (weights, and the
    optimizer state when it has it), or a Hugging Face GPT-2 folder checked against `spec` and read
    under our names (weights only)."""
    return InitialState(directory, foreign=lambda local: HFGPT2Weights(local, spec) if is_hf_gpt2(local) else None)
