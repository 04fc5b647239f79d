"""The one place that touches torch.distributed.pipelining's private entry points (torch==2.13.0).

Its `stage_backward_input` / `stage_backward_weight` split a stage's backward into the input
gradient (needed at once by the previous stage) and the weight gradient (deferrable into a bubble)
without running autograd twice; they are what its own zero-bubble schedules (I and W actions) use.
If a torch upgrade moves them, only this module changes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import _backward

ParamGroups = list[dict[str, Any]]


def backward_input(
    output: torch.Tensor,
    output_grad: torch.Tensor | None,
    stage_input: torch.Tensor,
    params: list[torch.nn.Parameter],
) -> tuple[torch.Tensor | None, ParamGroups]:
    """Gradient of the stage input; returns it and the state `backward_weight` needs later."""
    grads = None if output_grad is None else [output_grad]
    dinputs, param_groups = _backward.stage_backward_input([output], grads, [stage_input], iter(params))
    return dinputs[0], param_groups


def backward_weight(params: list[torch.nn.Parameter], param_groups: ParamGroups) -> None:
    """Accumulate the stage's parameter gradients into `.grad` from what `backward_input` saved."""
    _backward.stage_backward_weight(iter(params), param_groups)
