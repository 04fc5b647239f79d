"""Dynamic loss scaling for `precision = "fp16"`, as a function of the job's history.

float16 gradients underflow unless the loss is scaled up first; GradScaler's rule picks the scale:
start at `loss_scale_init`, halve it at every step whose gradients overflow (that step is skipped),
double it after `loss_scale_growth_interval` steps in a row without one. Here the scale of a step is
computed from the steps skipped before it, which every node knows alike (the skip is decided from the
global gradient norm every node receives, `runtime.train.optim.clip_decision`), a joiner gets with
its plan, and a checkpoint records: no node carries a scale another could disagree with, and a step
redone after a failure gets the scale it had the first time.

Scaling by a power of two is exact: the executor multiplies each micro-batch's loss by the scale
before the backward and multiplies the reduced gradients by its inverse before the optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.config import JobConfig

MAX_SCALE = 2.0**24
"""The scale never grows past this (float32 gradients of a scaled float16 loss stay far from overflow)."""


def uses_loss_scale(config: JobConfig) -> bool:
    """Whether `config`'s steps scale their loss (fp16 only)."""
    return config.precision == "fp16"


def loss_scale_at(config: JobConfig, step: int, skipped: Iterable[int]) -> float:
    """The loss scale of `step`, from the steps skipped before it (any order; later ones ignored)."""
    if not uses_loss_scale(config):
        return 1.0
    scale, run_start = config.loss_scale_init, 0
    for skip in sorted(s for s in set(skipped) if s < step):
        scale = _grown(config, scale, skip - run_start)
        scale = max(scale / 2.0, 1.0)
        run_start = skip + 1
    return _grown(config, scale, step - run_start)


def _grown(config: JobConfig, scale: float, good_steps: int) -> float:
    """`scale` after `good_steps` steps in a row without an overflow."""
    doublings = min(good_steps // config.loss_scale_growth_interval, 64)  # past 64 it is MAX_SCALE anyway
    return min(scale * 2.0**doublings, MAX_SCALE)
