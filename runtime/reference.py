"""Single-process reference training: the math every distributed run must reproduce."""

from __future__ import annotations

import torch

from runtime.config import JobConfig
from runtime.model import build_layer, loss_fn, microbatch_data
from runtime.optim import LayerState


def named_parameters(states: dict[int, LayerState]) -> dict[str, torch.Tensor]:
    """`layer{i}.{name}` -> a copy of the parameter, for comparisons across runs."""
    out = {}
    for i in sorted(states):
        for name, p in states[i].module.named_parameters():
            out[f"layer{i}.{name}"] = p.detach().clone()
    return out


def train_reference(
    config: JobConfig, steps: int | None = None
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train the whole model in one process; returns final parameters and the loss per step."""
    config.validate()
    spec = config.model
    states = {i: LayerState(i, build_layer(spec, i, config.seed)) for i in range(spec.num_layers)}
    losses = []
    for step in range(config.steps if steps is None else steps):
        total = 0.0
        for mb in range(config.num_microbatches):
            x, y = microbatch_data(spec, seed=config.seed, step=step, index=mb, size=config.microbatch_size)
            for i in range(spec.num_layers):
                x = states[i].module(x)
            loss = loss_fn(x, y)
            total += loss.item()
            (loss / config.num_microbatches).backward()
        for state in states.values():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in state.params]
            state.step(grads, lr=config.lr, weight_decay=config.weight_decay, snapshot=False)
            state.zero_grad()
        losses.append(total / config.num_microbatches)
    return named_parameters(states), losses
