"""Per-layer training state (parameters + AdamW moments + version) and its optimizer step.

State is kept per layer, not per stage, because layers move between nodes when the layout changes
(oobleck re-partitions, bamboo takes over a successor, a replacement fetches a stage). The moments
are allocated eagerly so a layer's state is always the same list of tensors: easy to snapshot,
send, checkpoint and compare.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from runtime.config import JobConfig

BETAS = (0.9, 0.95)
"""AdamW's default (beta1, beta2) (`JobConfig.betas`)."""
EPS = 1e-8
"""AdamW's default epsilon (`JobConfig.eps`)."""
CLIP_EPS = 1e-6
"""Added to the global norm before dividing (as `torch.nn.utils.clip_grad_norm_`)."""


def lr_at(config: JobConfig, step: int) -> float:
    """The learning rate of (0-based) `step`: the one schedule the executor and the reference use.

    Linear warmup over `warmup_steps` (step s gets lr * (s + 1) / warmup_steps), then `constant`
    (lr) or `cosine` (from lr down to `lr_min` at the last step, `config.steps - 1`)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    span = config.steps - 1 - config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / span) if span > 0 else 1.0
    return config.lr_min + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - config.lr_min)


@dataclass(frozen=True, slots=True)
class Hyper:
    """The optimizer's settings for one step (`hyper_at`)."""

    lr: float
    weight_decay: float
    betas: tuple[float, float] = BETAS
    eps: float = EPS
    decay_min_dim: int = 0
    """Only parameters with at least this many dimensions are decayed (0: all; 2: not biases, norms)."""


def hyper_at(config: JobConfig, step: int) -> Hyper:
    """`config`'s optimizer settings for (0-based) `step`."""
    b1, b2 = config.betas
    return Hyper(lr=lr_at(config, step), weight_decay=config.weight_decay, betas=(b1, b2), eps=config.eps,
                 decay_min_dim=config.weight_decay_min_dim)


def skips_nonfinite(config: JobConfig) -> bool:
    """Whether a step whose global gradient norm is not finite is skipped: asked for, implied by
    clipping (a non-finite norm would spread NaN), or fp16 (an overflow lowers the loss scale)."""
    return config.skip_nonfinite or config.clip > 0 or config.precision == "fp16"


def norm_needed(config: JobConfig) -> bool:
    """Whether a step computes the global gradient norm (clipping, or skipping non-finite steps)."""
    return config.clip > 0 or skips_nonfinite(config)


def layer_sumsq(grads: Sequence[torch.Tensor]) -> float:
    """Sum of squares of one layer's (reduced) gradients, in float64, parameters in order: the same
    bits wherever the layer's gradients are (a fresh float64 copy is summed)."""
    total = 0.0
    for g in grads:
        total += float(g.double().square().sum())
    return total


def clip_decision(config: JobConfig, per_layer: Sequence[float]) -> tuple[float, float | None, bool]:
    """From every layer's sum of squares (layer order): (global norm, clip factor or None, skip).

    Summed in layer order in float64, so every node and the reference get the same bits."""
    total = 0.0
    for v in per_layer:
        total += float(v)
    norm = math.sqrt(total) if total >= 0 else math.nan
    if not math.isfinite(norm):  # clipping by a non-finite norm would spread NaN: skip then too
        return norm, None, skips_nonfinite(config)
    if config.clip > 0:
        coef = config.clip / (norm + CLIP_EPS)
        if coef < 1.0:
            return norm, coef, False
    return norm, None, False


@torch.no_grad()
def scale_grads(grads: Sequence[torch.Tensor], coef: float) -> list[torch.Tensor]:
    """Clip: every gradient times `coef`, as new tensors (a reduced sum may still be on its way to a
    replica); element-wise, so any split of the parameters gives the same bits."""
    return [g * coef for g in grads]


class LayerState:
    """One layer's module, its AdamW moments, and `version` = optimizer steps applied so far."""

    def __init__(self, index: int, module: nn.Module) -> None:
        self.index = index
        self.module = module
        self.params = list(module.parameters())
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.version = 0
        self._snapshot: list[torch.Tensor] | None = None
        self._snapshot_version = -1

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state, in a fixed order (params, then first, then second moments)."""
        return [p.data for p in self.params] + self.exp_avg + self.exp_avg_sq

    def numel(self) -> int:
        """Total elements of `tensors()`."""
        return sum(t.numel() for t in self.tensors())

    def flat(self) -> torch.Tensor:
        """All state tensors concatenated, plus the version as the last element (float64), in host
        memory (a hand-over sends it over gloo; on a GPU node it is copied once, here)."""
        parts = [t.reshape(-1).double() for t in self.tensors()]
        body = torch.cat(parts).cpu() if parts else torch.zeros(0, dtype=torch.float64)  # a layer without parameters
        return torch.cat([body, torch.tensor([float(self.version)], dtype=torch.float64)])

    def load_flat(self, flat: torch.Tensor) -> None:
        """Inverse of `flat()`."""
        offset = 0
        for t in self.tensors():
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n
        self.version = int(flat[offset].item())
        self._snapshot = None

    def zero_grad(self) -> None:
        """Drop accumulated gradients."""
        for p in self.params:
            p.grad = None

    def rollback_to(self, version: int) -> None:
        """Restore the pre-step snapshot if this layer already applied the step that is being redone."""
        if self.version == version:
            return
        if self.version != version + 1 or self._snapshot_version != version or self._snapshot is None:
            raise RuntimeError(
                f"layer {self.index} is at version {self.version}; cannot roll back to {version}"
            )
        for t, s in zip(self.tensors(), self._snapshot, strict=True):
            t.copy_(s)
        self.version = version

    def step(
        self,
        grads: list[torch.Tensor],
        *,
        lr: float | None = None,
        weight_decay: float | None = None,
        snapshot: bool,
        hyper: Hyper | None = None,
        skip: bool = False,
    ) -> None:
        """Apply one AdamW step with the given (already averaged) gradients (`hyper`, or the default
        betas/eps with `lr` and `weight_decay`). `skip`: a step whose gradients were not finite:
        parameters and moments stay, the version still advances (it counts steps, and the bias
        correction counts the skipped step too)."""
        if hyper is None:
            assert lr is not None and weight_decay is not None
            hyper = Hyper(lr=lr, weight_decay=weight_decay)
        if snapshot:
            # Copy-before-write: a failure later in this step rolls this layer back (same-math).
            if self._snapshot is None:
                self._snapshot = [t.clone() for t in self.tensors()]
            else:
                for s, t in zip(self._snapshot, self.tensors(), strict=True):
                    s.copy_(t)
            self._snapshot_version = self.version
        if not skip:
            adamw_update(
                self.params, grads, self.exp_avg, self.exp_avg_sq, step=self.version + 1, lr=hyper.lr,
                wd=hyper.weight_decay, betas=hyper.betas, eps=hyper.eps, decay_min_dim=hyper.decay_min_dim,
            )
        self.version += 1


def held_bytes(states: Iterable[LayerState]) -> dict[str, int]:
    """Bytes of the training state in `states`: parameters, AdamW moments (`optimizer_bytes`), and the
    pre-step snapshots a fault-tolerant strategy keeps to roll a step back (`snapshot_bytes`)."""
    out = {"param_bytes": 0, "optimizer_bytes": 0, "snapshot_bytes": 0}
    for state in states:
        out["param_bytes"] += sum(_nbytes(p) for p in state.params)
        out["optimizer_bytes"] += sum(_nbytes(t) for t in (*state.exp_avg, *state.exp_avg_sq))
        out["snapshot_bytes"] += sum(_nbytes(t) for t in state._snapshot or ())
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@torch.no_grad()
def adamw_update(
    params: list[nn.Parameter],
    grads: list[torch.Tensor],
    exp_avg: list[torch.Tensor],
    exp_avg_sq: list[torch.Tensor],
    *,
    step: int,
    lr: float,
    wd: float,
    betas: tuple[float, float] = BETAS,
    eps: float = EPS,
    decay_min_dim: int = 0,
) -> None:
    """Decoupled-weight-decay Adam, element-wise, so any split of the parameters gives the same result.
    Only parameters with at least `decay_min_dim` dimensions are decayed.

    The operations, and so the rounding, of `torch.optim.AdamW(betas=betas, eps=eps)` on CPU (its
    single-tensor path, torch==2.13.0): the same parameters after the same gradients, bit for bit
    (tests/runtime/test_plain_pytorch.py). An equivalent formula rounded otherwise (m * b1 + (1 - b1)
    g, sqrt(v / bc2)) drifts from torch's by float32 noise that training amplifies step after step."""
    b1, b2 = betas
    bc1 = 1 - b1**step
    bc2_sqrt = (1 - b2**step) ** 0.5
    step_size = lr / bc1
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq, strict=True):
        if p.dim() >= decay_min_dim:
            p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
