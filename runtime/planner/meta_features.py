"""Features of a model's layers (FLOPs, bytes, kernels) from one forward pass on torch's `meta`
device: no memory, no compute, any model size. The predictor (`runtime.planner.predictor`) imports
this module on first use, so that importing the planner does not load torch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cache

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from runtime.config import USER_MODEL_KIND, LayerMeasure, ModelSpec
from runtime.models.model import build_layer
from runtime.planner.predictor import LayerFeatures


class _OpCounter(TorchDispatchMode):
    """Counts kernels and their FLOPs (torch's own per-op formulas) while a layer runs on `meta`.

    Lighter than `FlopCounterMode`, whose first use imports the compiler stack (seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.count += 1
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


@cache
def meta_layer_features(spec_items: tuple, microbatch_size: int, dtype: str) -> tuple[LayerFeatures, ...]:
    """Every layer's features for one micro-batch; `spec_items` is the ModelSpec as sorted
    (field, value) pairs, so that the result can be cached per model."""
    spec = ModelSpec(**{k: json.loads(v) if k == "args" else v for k, v in spec_items})
    if spec.kind == USER_MODEL_KIND:  # the planner runs in the control plane, which never imports user code
        raise ValueError(f"the planner has no features for a model function ({spec.path}); it plans built-in models")
    kind = getattr(torch, dtype)
    if spec.kind == "gpt":
        x = torch.zeros((microbatch_size, spec.seq_len), dtype=torch.long, device="meta")
    else:
        x = torch.zeros((microbatch_size, spec.in_features), device="meta", dtype=kind)

    def layers() -> Iterator[torch.nn.Module]:  # one at a time: a large model is never whole, even on meta
        for index in range(spec.num_layers):
            with torch.device("meta"):
                yield build_layer(spec, index, 0).to(kind)

    return tuple(measure_layers(layers(), x))


def measure_layers(layers: Iterable[torch.nn.Module], x: torch.Tensor) -> list[LayerFeatures]:
    """The features of `layers` run in turn on the meta device from the input `x` (its first
    dimension: the samples measured); each layer's input is the previous one's output."""
    out: list[LayerFeatures] = []
    x = x.to("meta")
    for index, layer in enumerate(layers):
        takes_grad = x.is_floating_point() and index > 0
        inp = x.detach().requires_grad_(takes_grad)
        saved: dict[int, float] = {}

        def pack(t: torch.Tensor, saved: dict[int, float] = saved) -> torch.Tensor:
            saved[id(t)] = t.numel() * t.element_size()
            return t

        with _OpCounter() as ops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = layer(inp)
        out.append(
            LayerFeatures(
                forward_flops=float(ops.flops),
                param_bytes=float(sum(p.numel() * p.element_size() for p in layer.parameters())),
                activation_bytes=float(sum(saved.values())),
                output_bytes=float(y.numel() * y.element_size()),
                has_input_grad=takes_grad,
                ops=ops.count,
            )
        )
        x = y.detach()
    return out


def measure_layers_per_sample(meta: list[torch.nn.Module], x: torch.Tensor) -> list[LayerMeasure]:
    """Each of `meta` (layers on the meta device, fed in turn from `x`) measured as a `LayerMeasure`:
    at one sample of `x` and at two, the difference being what a sample adds and the rest what the
    layer costs whatever the samples."""
    one = measure_layers(meta, x[:1])
    two = measure_layers(meta, torch.cat([x[:1], x[:1]]))
    parameters = [sum(p.numel() for p in layer.parameters()) for layer in meta]
    return [LayerMeasure(parameters=held, forward_flops=b.forward_flops - a.forward_flops,
                         fixed_forward_flops=max(0.0, 2 * a.forward_flops - b.forward_flops),
                         activation_bytes=b.activation_bytes - a.activation_bytes,
                         fixed_activation_bytes=max(0.0, 2 * a.activation_bytes - b.activation_bytes),
                         output_bytes=a.output_bytes, kernels=a.ops, input_grad=a.has_input_grad)
            for held, a, b in zip(parameters, one, two, strict=True)]
