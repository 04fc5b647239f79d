"""Random state of a layer's forward (dropout and any other randomness in a layer), derived from
(seed, step, micro-batch, layer), so it does not depend on which node runs the layer, in which
order, or how often (a redone step, bamboo's redundant forward): the same-math guarantee holds for
models with dropout. The global CPU generator is seeded for the call and restored afterwards
(about 3 us per layer call), so nothing else (the data order, other layers) sees a difference."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from runtime.config import JobConfig


def layer_seed(seed: int, step: int, microbatch: int, layer: int) -> int:
    """A 63-bit seed for one layer's forward on one micro-batch of one step (validation passes use
    `step = -1 - batch`)."""
    digest = hashlib.blake2b(f"{seed}/{step}/{microbatch}/{layer}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextlib.contextmanager
def layer_rng(seed: int, step: int, microbatch: int, layer: int) -> Iterator[None]:
    """Run a layer's forward with the CPU generator seeded by `layer_seed`, then restore it; in a
    process that computes on a GPU, that GPU's generator too (dropout on the GPU draws from it)."""
    generator = torch.default_generator
    saved = generator.get_state()
    value = layer_seed(seed, step, microbatch, layer)
    generator.manual_seed(value)
    cuda = torch.cuda.is_initialized()
    if cuda:
        saved_cuda = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(value)
    try:
        yield
    finally:
        generator.set_state(saved)
        if cuda:
            torch.cuda.set_rng_state(saved_cuda)


def forward_layer(config: JobConfig, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One layer's forward; with `config.recompute` (and gradients on), its activations are not kept
    but recomputed in the backward (`torch.utils.checkpoint`, non-reentrant), replaying the random
    state the forward had (`preserve_rng_state`) and the autocast state (checkpoint records it): the
    same bits as keeping them. With `config.precision` `bf16` or `fp16` the forward runs under
    bfloat16 or float16 autocast (on the device `x` is on); the parameters (and so their gradients and
    the optimizer state) stay float32."""
    low = _AUTOCAST.get(config.precision)
    with torch.autocast(x.device.type, dtype=low or torch.bfloat16, enabled=low is not None):
        if config.recompute and torch.is_grad_enabled():
            out = torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False, preserve_rng_state=True)
        else:
            out = module(x)
    # What crosses a stage boundary (and reaches the loss) stays float32: the receive buffers are
    # shaped and typed by a float32 dry run (`runtime.models.usermodel.boundary_shapes`), and the loss is
    # computed outside autocast. Casting here, in the one forward both the executor and the
    # reference run, keeps every boundary the same wherever the stages are cut; the cast is part of
    # the autograd graph, so the gradient sent back is float32 too.
    return out.float() if out.dtype in (torch.bfloat16, torch.float16) else out


_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""`JobConfig.precision` -> the autocast dtype of a layer's forward (fp32: none)."""


@contextlib.contextmanager
def evaluating(modules: Iterable[nn.Module]) -> Iterator[None]:
    """`modules` in eval mode (no dropout, norms' running statistics untouched), restored after:
    a validation pass measures the model, not one draw of its dropout masks."""
    modules = list(modules)
    modes = [m.training for m in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, mode in zip(modules, modes, strict=True):
            module.train(mode)
