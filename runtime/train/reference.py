"""Single-process reference training: the math every distributed run must reproduce."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from runtime.config import JobConfig
from runtime.data.dataset import Batches
from runtime.distributed.grad_order import home_pipelines
from runtime.models.model import build_layer
from runtime.models.rng import evaluating, forward_layer, layer_rng
from runtime.models.usermodel import loss_for
from runtime.parallel.device import resolve_device, use_device
from runtime.train.loss_scale import loss_scale_at
from runtime.train.optim import LayerState, clip_decision, hyper_at, layer_sumsq, norm_needed, scale_grads


def named_parameters(states: dict[int, LayerState]) -> dict[str, torch.Tensor]:
    """`layer{i}.{name}` -> a copy of the parameter, for comparisons across runs."""
    out = {}
    for i in sorted(states):
        for name, p in states[i].module.named_parameters():
            out[f"layer{i}.{name}"] = p.detach().to("cpu", copy=True)  # host copies, from any device
    return out


def train_reference(
    config: JobConfig, steps: int | None = None
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train the whole model in one process; returns final parameters and the loss per step."""
    run = reference_run(config, steps)
    return run.params, run.losses


@dataclass(slots=True)
class ReferenceRun:
    """What the single-process reference computed."""

    params: dict[str, torch.Tensor]
    """Final parameters by name (`layer{i}.{param}`)."""
    losses: list[float]
    """Training loss per step."""
    val_losses: dict[int, float] = field(default_factory=dict)
    """Validation loss by step index (the last step done), when `val_every` asks for it."""
    grad_norms: list[float | None] = field(default_factory=list)
    """Global gradient norm per step (before clipping), None when the config computes none."""
    skipped: list[int] = field(default_factory=list)
    """Steps skipped for a non-finite gradient."""


def reference_run(config: JobConfig, steps: int | None = None,
                  on_step: Callable[[int], None] | None = None) -> ReferenceRun:
    """Train the whole model in one process, validating where the distributed run does.

    Single-threaded like every worker (`Worker.run`): some CPU kernels (the embedding's backward)
    add in a different order with more threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, steps, on_step)
    finally:
        torch.set_num_threads(threads)


def validation_loss(config: JobConfig, layers: list[torch.nn.Module], batches: Batches) -> float:
    """Mean loss over the held-out micro-batches a validation pass reads (no gradients, eval mode)."""
    total, count = 0.0, 0
    loss_fn = loss_for(config.model)
    device = next(layers[0].parameters()).device
    with torch.no_grad(), evaluating(layers):
        for batch in range(config.data.val_batches):
            for mb in range(config.num_microbatches):
                x, y = (t.to(device) for t in batches.val(batch=batch, index=mb, size=config.microbatch_size))
                for i, layer in enumerate(layers):
                    with layer_rng(config.seed, -1 - batch, mb, i):
                        x = forward_layer(config, layer, x)  # the executor's forward (bf16 autocast too)
                total += loss_fn(x, y).item()
                count += 1
    return total / count


def _train(config: JobConfig, steps: int | None, on_step: Callable[[int], None] | None = None) -> ReferenceRun:
    config.validate()
    batches = Batches(config)
    try:
        return _train_on(config, steps, batches, on_step)
    finally:
        batches.close()  # a streamed source's prefetches stop with the run


def _train_on(config: JobConfig, steps: int | None, batches: Batches,
              on_step: Callable[[int], None] | None) -> ReferenceRun:
    spec = config.model
    loss_fn = loss_for(spec)
    device = resolve_device(config)  # a cuda job's reference runs on this host's first GPU
    use_device(device)
    states = {i: LayerState(i, build_layer(spec, i, config.seed).to(device)) for i in range(spec.num_layers)}
    params = [p for i in range(spec.num_layers) for p in states[i].params]
    home = home_pipelines(config)
    run = ReferenceRun(params={}, losses=[])
    last = config.steps if steps is None else steps
    for step in range(last):
        if on_step is not None:  # a benchmark's clock: when each step starts
            on_step(step)
        total = 0.0
        scale = loss_scale_at(config, step, run.skipped)
        # Sum the gradients in `grad_order`'s fixed order: per home pipeline, micro-batches in
        # order; then the pipelines in order. The distributed runs reproduce it bit for bit.
        sums: dict[int, list[torch.Tensor]] = {}
        for mb in range(config.num_microbatches):
            x, y = (t.to(device) for t in batches.train(step=step, index=mb, size=config.microbatch_size))
            for i in range(spec.num_layers):
                with layer_rng(config.seed, step, mb, i):  # dropout: the executor's random state
                    x = forward_layer(config, states[i].module, x)
            loss = loss_fn(x, y)
            total += loss.item()
            for p, grad in zip(params, sums.get(home[mb], [None] * len(params)), strict=True):
                p.grad = grad
            scaled = loss / config.num_microbatches
            (scaled if scale == 1.0 else scaled * scale).backward()  # the executor's loss scaling
            sums[home[mb]] = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        first, *rest = sorted(sums)
        grads = [s.clone() for s in sums[first]]
        for g in rest:
            for summed, part in zip(grads, sums[g], strict=True):
                summed.add_(part)
        if scale != 1.0:
            grads = [g * (1.0 / scale) for g in grads]
        per_layer, at = [], 0
        for i in range(spec.num_layers):
            per_layer.append(grads[at : at + len(states[i].params)])
            at += len(states[i].params)
        coef, skip, norm = None, False, None
        if norm_needed(config):  # the executor's `_exchange_norms`, in one process
            norm, coef, skip = clip_decision(config, [layer_sumsq(g) for g in per_layer])
        run.grad_norms.append(norm)
        if skip:
            run.skipped.append(step)
        hyper = hyper_at(config, step)
        for i in range(spec.num_layers):
            state = states[i]
            own = per_layer[i] if coef is None or skip else scale_grads(per_layer[i], coef)
            state.step(own, hyper=hyper, snapshot=False, skip=skip)
            state.zero_grad()
        run.losses.append(total / config.num_microbatches)
        done = step + 1
        if config.validation_due(done):
            run.val_losses[step] = validation_loss(config, [states[i].module for i in range(spec.num_layers)], batches)
    run.params = named_parameters(states)
    return run
