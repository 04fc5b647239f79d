"""Single-process reference training: the math every distributed run must reproduce."""

from __future__ import annotations

import torch

from runtime.config import JobConfig
from runtime.grad_order import home_pipelines
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
    """Train the whole model in one process; returns final parameters and the loss per step.

    Single-threaded like every worker (`Worker.run`): some CPU kernels (the embedding's backward)
    add in a different order with more threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, steps)
    finally:
        torch.set_num_threads(threads)


def _train(config: JobConfig, steps: int | None) -> tuple[dict[str, torch.Tensor], list[float]]:
    config.validate()
    spec = config.model
    states = {i: LayerState(i, build_layer(spec, i, config.seed)) for i in range(spec.num_layers)}
    params = [p for i in range(spec.num_layers) for p in states[i].params]
    home = home_pipelines(config)
    losses = []
    for step in range(config.steps if steps is None else steps):
        total = 0.0
        # Sum the gradients in `grad_order`'s fixed order: per home pipeline, micro-batches in
        # order; then the pipelines in order. The distributed runs reproduce it bit for bit.
        sums: dict[int, list[torch.Tensor]] = {}
        for mb in range(config.num_microbatches):
            x, y = microbatch_data(spec, seed=config.seed, step=step, index=mb, size=config.microbatch_size)
            for i in range(spec.num_layers):
                x = states[i].module(x)
            loss = loss_fn(x, y)
            total += loss.item()
            for p, grad in zip(params, sums.get(home[mb], [None] * len(params)), strict=True):
                p.grad = grad
            (loss / config.num_microbatches).backward()
            sums[home[mb]] = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        first, *rest = sorted(sums)
        grads = [s.clone() for s in sums[first]]
        for g in rest:
            for total, part in zip(grads, sums[g], strict=True):
                total.add_(part)
        at = 0
        for i in range(spec.num_layers):
            state = states[i]
            own, at = grads[at : at + len(state.params)], at + len(state.params)
            state.step(own, lr=config.lr, weight_decay=config.weight_decay, snapshot=False)
            state.zero_grad()
        losses.append(total / config.num_microbatches)
    return named_parameters(states), losses
