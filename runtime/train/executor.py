"""Runs one node's action list for one step over a generation's process groups.

Every compute action can be padded to an emulated device time (see `DeviceTime`) so that, on a
laptop, stages that sleep overlap like devices would. Gradients are scaled by 1/num_microbatches,
so the all-reduced sum is the global-batch mean whatever the routes are, and `grad_order` adds the
micro-batches' gradients in one fixed order, so not even the low bits depend on which node ran
which micro-batch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from runtime.config import JobConfig
from runtime.data.dataset import Batches
from runtime.distributed.comm import Comm, PeerAborted
from runtime.distributed.grad_order import GradAccumulator, RunSum, grad_plan, home_pipelines, runs_in_order
from runtime.models.rng import evaluating, forward_layer, layer_rng
from runtime.models.usermodel import boundary_shapes, loss_for
from runtime.parallel import _pipelining
from runtime.parallel.device import ComputeTimer, Staging
from runtime.parallel.layout import Layout
from runtime.parallel.schedule import (
    ALL_REDUCE,
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    OPTIMIZER,
    RECV_ACT,
    RECV_GRAD,
    REDUNDANT_FORWARD,
    SEND_ACT,
    SEND_GRAD,
    Action,
)
from runtime.train.optim import LayerState, clip_decision, hyper_at, layer_sumsq, norm_needed, scale_grads


@dataclass(slots=True)
class StepResult:
    """What one node measured in one step."""

    loss_sum: float = 0.0
    """Sum of the per-micro-batch mean losses this node computed (last hops only)."""
    loss_count: int = 0
    """Micro-batches whose loss this node computed."""
    stage_time_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    """Busy (compute) seconds per stage id."""
    grad_norm: float | None = None
    """The global gradient norm (all layers, before clipping), when the step computed it."""
    skipped: bool = False
    """The gradients were not finite: no node applied this step (the versions still advance)."""


class Executor:
    """Executes action lists of one layout on one node; holds nothing across generations."""

    def __init__(
        self,
        config: JobConfig,
        layout: Layout,
        node: int,
        held: dict[int, LayerState],
        comm: Comm | None,
        batches: Batches | None = None,
        staging: Staging | None = None,
    ) -> None:
        self.config = config
        self.staging = staging or Staging(torch.device("cpu"))
        """Where this node computes, and the copies of messages between it and gloo's host buffers."""
        self.batches = batches or Batches(config)
        self._val_batch: int | None = None
        self._last_data: tuple[tuple[int | None, int, int], tuple[torch.Tensor, torch.Tensor]] | None = None
        self.layout = layout
        self.node = node
        self.held = held
        self.comm = comm
        self.num_mb = layout.num_microbatches
        self.hop_of = {
            (stage, m): h for m, route in enumerate(layout.routes) for h, (stage, _) in enumerate(route)
        }
        first_input = self.batches.train(step=0, index=0, size=layout.microbatch_size)[0]
        self.boundaries = boundary_shapes(config, first_input)
        """(shape, dtype) of the activation entering each layer (what boundary `b` sends)."""
        self.loss_fn = loss_for(config.model)
        self.device_time = config.device_time
        self.plan = grad_plan(layout, home_pipelines(config))
        self.layer_numel = {i: sum(p.numel() for p in state.params) for i, state in held.items()}
        self.grads: GradAccumulator | None = None
        self._in_order: tuple[list[Action], bool] | None = None
        self.snapshot = config.strategy != "none"
        self.current: Action | None = None
        self.hook: Callable[[int, int], None] | None = None
        """Called with (action index, number of actions) before each action (fault injection)."""
        self._norm_done = False
        """This step's gradient-norm exchange completed (or is not needed)."""
        self._open_reduces: list = []
        """This step's all-reduces started and not finished (`Comm.abandon_allreduce` on failure)."""
        self._update: tuple[dict, float | None, bool, object] | None = None
        """This step's reduced gradients by run, clip factor, skip and optimizer settings."""
        self._losses: list[torch.Tensor] = []
        """This step's per-micro-batch losses, read from the device once, at the step's end."""
        self._loss_scale = 1.0
        """This step's loss scale (`run_step`)."""

    # -- helpers ------------------------------------------------------------------------------
    def _layers(self, stage: int) -> list[nn.Module]:
        lo, hi = self.layout.stages[stage]
        return [self.held[i].module for i in range(lo, hi)]

    def _params(self, stage: int) -> list[nn.Parameter]:
        lo, hi = self.layout.stages[stage]
        return [p for i in range(lo, hi) for p in self.held[i].params]

    def _buffer(self, boundary: int) -> torch.Tensor:
        """An empty tensor shaped like what crosses `boundary` (the input of layer `boundary`)."""
        shape, dtype = self.boundaries[boundary]
        return self.staging.host_buffer(shape, dtype)

    def _tag(self, mb: int, boundary: int, backward: bool) -> int:
        return (mb * (self.layout.num_layers + 1) + boundary) * 2 + int(backward)

    def _pad(self, act: Action, started: float) -> None:
        """Sleep until the action has taken its emulated device time."""
        if self.device_time is None:
            return
        lo, hi = self.layout.stages[act.stage]
        per_layer = {
            FORWARD: self.device_time.forward_ms,
            REDUNDANT_FORWARD: self.device_time.forward_ms,
            BACKWARD_INPUT: self.device_time.backward_input_ms,
            BACKWARD_WEIGHT: self.device_time.backward_weight_ms,
            BACKWARD: self.device_time.backward_input_ms + self.device_time.backward_weight_ms,
        }[act.kind]
        left = per_layer * (hi - lo) / 1000.0 - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)

    def _data(self, step: int, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (self._val_batch, step, mb)
        if self._last_data is not None and self._last_data[0] == key:  # a one-stage route reads x, then y
            return self._last_data[1]
        size = self.layout.microbatch_size
        if self._val_batch is not None:
            data = self.batches.val(batch=self._val_batch, index=mb, size=size)
        else:
            data = self.batches.train(step=step, index=mb, size=size)
        data = (self.staging.to_device(data[0]), self.staging.to_device(data[1]))
        self._last_data = (key, data)
        return data

    def run_validation(self, batch: int, actions: list[Action]) -> StepResult:
        """Run `actions` (a `forward_schedule` list) on validation batch `batch`: forward only, no
        gradients, modules in eval mode (no dropout); the losses are in the result as for a training step."""
        self._val_batch = batch
        modules = [state.module for state in self.held.values()]
        try:
            with torch.no_grad(), evaluating(modules):
                return self.run_step(-1, actions)
        finally:
            self._val_batch = None

    # -- the step -----------------------------------------------------------------------------
    def run_step(self, step: int, actions: list[Action], loss_scale: float = 1.0) -> StepResult:
        """Run `actions` for `step`: compute, communicate, all-reduce and apply the optimizer.
        `loss_scale` (fp16, `runtime.train.loss_scale`): the losses are multiplied by it before the
        backward and the reduced gradients by its inverse before the norm and the optimizer."""
        result = StepResult()
        self._loss_scale = loss_scale
        inputs: dict[tuple[int, int], torch.Tensor] = {}
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        out_grads: dict[tuple[int, int], torch.Tensor] = {}
        param_groups: dict[tuple[int, int], _pipelining.ParamGroups] = {}
        rf_inputs: dict[tuple[int, int], torch.Tensor] = {}
        keep_alive: list[torch.Tensor] = []
        self.grads = GradAccumulator(
            self.plan,
            self.node,
            {i: list(state.params) for i, state in self.held.items()},
            in_order=self._val_batch is not None or self._runs_in_order(actions),  # validation: no gradients
        )
        reduces: dict[tuple[tuple[int, int], tuple[int, ...]], tuple[torch.Tensor, object]] = {}
        comm = self.comm
        started = time.perf_counter()
        self._norm_done = self._val_batch is not None or not norm_needed(self.config)
        self._update = None
        self._open_reduces = []
        self._losses = []
        timer = ComputeTimer(self.staging.device)
        try:
            self._loop(
                step,
                actions,
                result,
                inputs,
                outputs,
                out_grads,
                param_groups,
                rf_inputs,
                keep_alive,
                reduces,
                timer,
            )
        except RuntimeError as exc:
            self._poison(actions, started_reduces=reduces, consumed=isinstance(exc, PeerAborted))
            # Name the action that failed and how long it waited: that is how a dead peer shows up.
            waited = time.perf_counter() - started
            raise RuntimeError(
                f"step {step}, action {self.current}: {exc} (after {waited:.3f}s in step)"
            ) from None
        if comm is not None:
            comm.wait_sends()
        del keep_alive
        if self._losses:  # one read from the device per step, summed in micro-batch order as before
            result.loss_sum = sum(torch.stack(self._losses).tolist())
        result.stage_time_s.update(timer.seconds())
        return result

    def _poison(self, actions: list[Action], *, started_reduces: dict, consumed: bool) -> None:
        """We abandon the step: poison every message we still owe, and accept every message we are
        still owed (a peer's send completes only once we posted its receive), so peers fail or move
        on now, not at their timeout. `consumed`: the current action's receive got a poison message."""
        if self.comm is None:
            return
        if not self._norm_done:  # whoever waits for our part of the norm exchange gives up now
            self.comm.poison_norms(self.layout.num_layers)
        for handle in self._open_reduces:  # started: we may still owe our chunk of the sum
            self.comm.abandon_allreduce(handle)
        self._open_reduces = []
        if self.current is None:
            return
        current = self.current
        for act in actions[actions.index(current) :]:
            if act.kind in (SEND_ACT, SEND_GRAD, RECV_ACT, RECV_GRAD):
                lo, hi = self.layout.stages[act.stage]
                backward = act.kind in (SEND_GRAD, RECV_GRAD)
                boundary = lo if (act.kind in (SEND_GRAD, RECV_ACT)) else hi
                tag = self._tag(act.microbatch, boundary, backward)
                if act.kind in (SEND_ACT, SEND_GRAD):
                    self.comm.send_poison(self._buffer(boundary), act.peer, tag)
                elif not (act is current and consumed):
                    self.comm.drain(self._buffer(boundary), act.peer, tag)
            elif act.kind == ALL_REDUCE and (act.layers, act.group) not in started_reduces:
                replicas = self._replica_owners(act)
                self.comm.poison_allreduce(act.group, act.layers[0], self._run_sum(act), replicas)
                self.comm.drain_allreduce(act.group, act.layers[0], self._run_sum(act), replicas)

    def _loop(
        self, step, actions, result, inputs, outputs, out_grads, param_groups, rf_inputs, keep_alive, reduces, timer
    ):
        comm = self.comm
        for index, act in enumerate(actions):
            self.current = act
            if self.hook is not None:
                self.hook(index, len(actions))
            key = (act.stage, act.microbatch)
            started = time.perf_counter()
            mark = timer.start()
            if act.kind == RECV_ACT:
                buf = self._buffer(self.layout.stages[act.stage][0])
                comm.recv(buf, act.peer, self._tag(act.microbatch, self.layout.stages[act.stage][0], False))
                inputs[key] = self.staging.to_device(buf).requires_grad_()
            elif act.kind == SEND_ACT:
                out = self.staging.to_host(outputs[key].detach())
                keep_alive.append(out)
                comm.send(out, act.peer, self._tag(act.microbatch, self.layout.stages[act.stage][1], False))
            elif act.kind == RECV_GRAD:
                buf = self._buffer(self.layout.stages[act.stage][1])
                comm.recv(buf, act.peer, self._tag(act.microbatch, self.layout.stages[act.stage][1], True))
                out_grads[key] = self.staging.to_device(buf)
            elif act.kind == SEND_GRAD:
                grad = self.staging.to_host(inputs.pop(key).grad)
                keep_alive.append(grad)
                comm.send(grad, act.peer, self._tag(act.microbatch, self.layout.stages[act.stage][0], True))
            elif act.kind == FORWARD:
                self._forward(step, act, inputs, outputs, rf_inputs, result)
            elif act.kind in (BACKWARD, BACKWARD_INPUT):
                self._backward(act, inputs, outputs, out_grads, param_groups)
            elif act.kind == BACKWARD_WEIGHT:
                self.grads.begin(range(*self.layout.stages[act.stage]), act.microbatch)
                _pipelining.backward_weight(self._params(act.stage), param_groups.pop(key))
                self.grads.end()
            elif act.kind == REDUNDANT_FORWARD:
                self._redundant_forward(step, act, rf_inputs)
            elif act.kind == ALL_REDUCE:
                reduces[(act.layers, act.group)] = self._start_allreduce(act)
            elif act.kind == OPTIMIZER:
                if self._update is None:
                    self._update = self._prepare_update(step, actions, index, reduces, result)
                    self.current = act
                self._optimizer_step(act)
            else:
                raise ValueError(f"unknown action kind {act.kind!r}")
            if act.stage >= 0 and act.kind in (
                FORWARD,
                BACKWARD,
                BACKWARD_INPUT,
                BACKWARD_WEIGHT,
                REDUNDANT_FORWARD,
            ):
                self._pad(act, started)
                timer.stop(act.stage, mark)
        if not self._norm_done:  # no optimizer action here: still take part in the norm exchange
            self._exchange_norms({}, result)

    def _forward(self, step, act, inputs, outputs, rf_inputs, result) -> None:
        key = (act.stage, act.microbatch)
        route = self.layout.routes[act.microbatch]
        hop = self.hop_of[key]
        if hop == 0:
            x = self._data(step, act.microbatch)[0]
            inputs[key] = x
        x = inputs[key]
        out = self._run_layers(step, act, x)
        if hop == len(route) - 1:
            loss = self.loss_fn(out, self._data(step, act.microbatch)[1])
            self._losses.append(loss.detach())
            result.loss_count += 1
            outputs[key] = loss / self.num_mb if self._loss_scale == 1.0 else (loss / self.num_mb) * self._loss_scale
        else:
            outputs[key] = out
            nxt_stage, nxt_node = route[hop + 1]
            if nxt_node == self.node:  # consecutive stages on this node: hand over locally
                inputs[(nxt_stage, act.microbatch)] = out.detach().requires_grad_()
        # bamboo: keep what the replicated successor's redundant forward will consume
        nxt_stage = route[(hop + 1) % len(route)][0]
        if hop < len(route) - 1 and any(s == nxt_stage and n == self.node for s, n in self.layout.replicas):
            rf_inputs[(nxt_stage, act.microbatch)] = out.detach()

    def _run_layers(self, step: int, act: Action, x: torch.Tensor) -> torch.Tensor:
        """The stage's layers on `x`, each with its random state (`runtime.models.rng`: dropout is the same
        wherever and however often the layer runs)."""
        rng_step = step if self._val_batch is None else -1 - self._val_batch
        lo, hi = self.layout.stages[act.stage]
        for i in range(lo, hi):
            with layer_rng(self.config.seed, rng_step, act.microbatch, i):
                x = forward_layer(self.config, self.held[i].module, x)
        return x

    def _redundant_forward(self, step, act, rf_inputs) -> None:
        if self.hop_of[(act.stage, act.microbatch)] == 0:  # replica of the first stage: input is the data
            x = self._data(step, act.microbatch)[0]
        else:
            x = rf_inputs.pop((act.stage, act.microbatch))
        with torch.no_grad():
            self._run_layers(step, act, x)

    def _backward(self, act, inputs, outputs, out_grads, param_groups) -> None:
        key = (act.stage, act.microbatch)
        route = self.layout.routes[act.microbatch]
        hop = self.hop_of[key]
        out = outputs.pop(key)
        grad = None
        if hop < len(route) - 1:
            grad = out_grads.pop(key, None)
            if grad is None:  # produced locally by the next stage on this node
                grad = inputs.pop((route[hop + 1][0], act.microbatch)).grad
        x = inputs[key]
        if act.kind == BACKWARD:
            self.grads.begin(range(*self.layout.stages[act.stage]), act.microbatch)
            torch.autograd.backward(out, grad)
            self.grads.end()
        else:
            dx, groups = _pipelining.backward_input(out, grad, x, self._params(act.stage))
            x.grad = dx
            param_groups[key] = groups
        if hop == 0:
            inputs.pop(key)
        # Otherwise x (now holding its gradient) stays in `inputs`: SEND_GRAD pops it, or, when the
        # previous stage runs on this node too, that stage's backward reads it.

    def _start_allreduce(self, act: Action):
        lo, hi = act.layers
        replicas = self._replica_owners(act)
        if self.node in replicas:  # computes nothing here: receives the finished sum
            flat = torch.zeros(sum(self.layer_numel[i] for i in range(lo, hi)))
        else:
            # Summed on the host in the fixed order (`grad_order`): what gloo sends is there anyway,
            # and float32 additions give the same bits on either side.
            flat = self.staging.to_host(self.grads.contribution(lo, hi))
            if self.comm is None or len(act.group) == 1:
                return flat, None
        handle = self.comm.allreduce(flat, act.group, lo, self._run_sum(act), replicas)
        self._open_reduces.append(handle)
        return flat, handle

    def _runs_in_order(self, actions: list[Action]) -> bool:
        """`grad_order.runs_in_order` for this action list (the same list every step of a generation)."""
        if self._in_order is None or self._in_order[0] is not actions:
            backwards = [
                (range(*self.layout.stages[act.stage]), act.microbatch)
                for act in actions
                if act.kind in (BACKWARD, BACKWARD_WEIGHT)
            ]
            self._in_order = (actions, runs_in_order(self.plan, self.node, backwards))
        return self._in_order[1]

    def _run_sum(self, act: Action) -> RunSum:
        return RunSum(self.plan, *act.layers, self.layer_numel)

    def _replica_owners(self, act: Action) -> tuple[int, ...]:
        """Owners of the run that only keep a replica (they compute nothing for these layers)."""
        lo, hi = act.layers
        computing = set()
        for route in self.layout.routes:
            for stage, node in route:
                slo, shi = self.layout.stages[stage]
                if slo < hi and lo < shi:
                    computing.add(node)
        return tuple(n for n in act.group if n not in computing)

    def _finish(self, act: Action, flat: torch.Tensor, handle) -> dict[int, list[torch.Tensor]]:
        """Finish the all-reduce of `act`'s run: layer -> its reduced gradients (views of the sum)."""
        if handle is not None:
            flat = self.comm.finish_allreduce(handle)
            self._open_reduces.remove(handle)
        else:
            flat = self._run_sum(act).fold({self.node: flat})
        flat = self.staging.to_device(flat)
        if self._loss_scale != 1.0:  # exact (a power of two); out of place: the sum may still be going to a replica
            flat = flat * (1.0 / self._loss_scale)
        out: dict[int, list[torch.Tensor]] = {}
        offset = 0
        for i in range(*act.layers):
            grads = []
            for p in self.held[i].params:
                grads.append(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            out[i] = grads
        return out

    def _prepare_update(self, step: int, actions: list[Action], index: int, reduces: dict, result: StepResult):
        """Before the first optimizer action: finish every all-reduce of this node (in action order,
        forwarding to replicas as before), then, when clipping or the non-finite check is on,
        exchange the global gradient norm so every node scales, or skips, alike."""
        finished: dict[tuple, dict[int, list[torch.Tensor]]] = {}
        for act in actions[index:]:  # every chunk out before any gather is awaited (no cross-run wait)
            if act.kind == OPTIMIZER and reduces[(act.layers, act.group)][1] is not None:
                self.current = act
                self.comm.reduce_chunk(reduces[(act.layers, act.group)][1])
        for act in actions[index:]:
            if act.kind == OPTIMIZER:
                self.current = act
                flat, work = reduces.pop((act.layers, act.group))
                finished[(act.layers, act.group)] = self._finish(act, flat, work)
        coef, skip = None, False
        if not self._norm_done:
            coef, skip = self._exchange_norms(finished, result)
        return finished, coef, skip, hyper_at(self.config, step)

    def _exchange_norms(self, finished: dict, result: StepResult) -> tuple[float | None, bool]:
        """Sum, over all members, each layer's sum of squares of its reduced gradients, filled in by
        the layer's designated owner (the first owner of its run, so replicas count once); zeros
        elsewhere add exactly, so every entry has the bits of one computation, and `clip_decision`
        adds the layers in order: every node and the reference decide alike."""
        vector = torch.zeros(self.layout.num_layers, dtype=torch.float64)
        for (_, group), grads in finished.items():
            if group[0] == self.node:
                for i, g in grads.items():
                    vector[i] = layer_sumsq(g)
        if self.comm is not None and len(self.comm.members) > 1:
            self.comm.sum_norms(vector)
        self._norm_done = True
        norm, coef, skip = clip_decision(self.config, vector.tolist())
        result.grad_norm, result.skipped = norm, skip
        return coef, skip

    def _optimizer_step(self, act: Action) -> None:
        finished, coef, skip, hyper = self._update
        grads = finished.pop((act.layers, act.group))
        for i in range(*act.layers):
            state = self.held[i]
            own = grads[i] if coef is None or skip else scale_grads(grads[i], coef)
            state.step(own, hyper=hyper, snapshot=self.snapshot, skip=skip)
            state.zero_grad()
