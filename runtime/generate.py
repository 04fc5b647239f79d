"""Use a trained GPT: put the nodes' final parameters back together and sample text from it.

Each node of a finished job saves the parameters of the layers it holds (`node-<id>.pt`,
`layer{i}.{name}` -> tensor); any set of files that covers every layer makes the whole model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from runtime.config import ModelSpec
from runtime.model import build_model


def assemble_model(param_files: Iterable[Path], spec: ModelSpec, seed: int = 0) -> nn.Sequential:
    """The whole model from the nodes' parameter files; `ValueError` naming the layers no file holds."""
    state: dict[str, torch.Tensor] = {}
    for path in param_files:
        for name, tensor in torch.load(path, map_location="cpu", weights_only=True)["params"].items():
            layer, _, rest = name.partition(".")
            state[f"{layer.removeprefix('layer')}.{rest}"] = tensor
    model = build_model(spec, seed)
    missing = sorted({int(k.split(".")[0]) for k in model.state_dict()} - {int(k.split(".")[0]) for k in state})
    if missing:
        raise ValueError(f"no parameter file holds layer(s) {missing} of the {spec.num_layers}-layer model")
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def sample(model: nn.Sequential, spec: ModelSpec, prompt: list[int], new_tokens: int, *,
           temperature: float = 0.8, seed: int = 0) -> list[int]:
    """`new_tokens` ids drawn one by one after `prompt` (the last `seq_len` ids as context)."""
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(new_tokens):
        context = torch.tensor([ids[-spec.seq_len:]], dtype=torch.int64)
        logits = model(context)[0, -1] / temperature
        ids.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)))
    return ids[len(prompt):]
