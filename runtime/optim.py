"""Per-layer training state (parameters + AdamW moments + version) and its optimizer step.

State is kept per layer, not per stage, because layers move between nodes when the layout changes
(oobleck re-partitions, bamboo takes over a successor, a replacement fetches a stage). The moments
are allocated eagerly so a layer's state is always the same list of tensors: easy to snapshot,
send, checkpoint and compare.
"""

from __future__ import annotations

import torch
from torch import nn

BETAS = (0.9, 0.95)
EPS = 1e-8


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
        """All state tensors concatenated, plus the version as the last element (float64)."""
        body = torch.cat([t.reshape(-1).double() for t in self.tensors()])
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

    def step(self, grads: list[torch.Tensor], *, lr: float, weight_decay: float, snapshot: bool) -> None:
        """Apply one AdamW step with the given (already averaged) gradients."""
        if snapshot:
            # Copy-before-write: a failure later in this step rolls this layer back (same-math).
            if self._snapshot is None:
                self._snapshot = [t.clone() for t in self.tensors()]
            else:
                for s, t in zip(self._snapshot, self.tensors(), strict=True):
                    s.copy_(t)
            self._snapshot_version = self.version
        adamw_update(
            self.params, grads, self.exp_avg, self.exp_avg_sq, step=self.version + 1, lr=lr, wd=weight_decay
        )
        self.version += 1


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
) -> None:
    """Decoupled-weight-decay Adam, element-wise, so any split of the parameters gives the same result.

    The operations, and so the rounding, of `torch.optim.AdamW(betas=BETAS, eps=EPS)` on CPU (its
    single-tensor path, torch==2.13.0): the same parameters after the same gradients, bit for bit
    (tests/runtime/test_plain_pytorch.py). An equivalent formula rounded otherwise (m * b1 + (1 - b1)
    g, sqrt(v / bc2)) drifts from torch's by float32 noise that training amplifies step after step."""
    b1, b2 = BETAS
    bc1 = 1 - b1**step
    bc2_sqrt = (1 - b2**step) ** 0.5
    step_size = lr / bc1
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq, strict=True):
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / bc2_sqrt).add_(EPS)
        p.addcdiv_(m, denom, value=-step_size)
