"""A node's layer states across generations: at each new plan, bring what the node holds to exactly
its layers at the plan's start step. Roll a half-applied step back, restore from a checkpoint when
the plan says so, and otherwise move layers between nodes in a hand-over (a short-lived group of
the nodes that send or receive); a node that leaves stays until its receivers train with what it
sent. Layers nobody held since the start are built as the job starts them (seeded, or `init_from`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from runtime.checkpointing.checkpoints import Checkpoints
from runtime.checkpointing.export import InitialState
from runtime.config import JobConfig
from runtime.distributed.comm import Comm
from runtime.distributed.coordinator import Coordinator, wait_ready
from runtime.distributed.generation_plan import GenerationPlan
from runtime.models.model import build_layer
from runtime.parallel.layout import Layout
from runtime.train.faults import FaultInjector
from runtime.train.optim import LayerState

Held = dict[int, LayerState]


class Handover:
    """One worker's side of every generation change (see the module docstring)."""

    def __init__(self, *, config: JobConfig, node: int, device: torch.device, coord: Coordinator,
                 generation_store: Callable[[int], dist.Store], checkpoints: Checkpoints,
                 init: InitialState | None, init_step: int, emit: Callable[[dict[str, Any]], None],
                 faults: FaultInjector | None) -> None:
        self.config = config
        self.node = node
        self.device = device
        self.coord = coord
        self.generation_store = generation_store
        self.checkpoints = checkpoints
        self.init = init
        self.init_step = init_step
        self._emit = emit
        self.faults = faults
        self._state_bytes: dict[int, int] = {}

    # -- layers as the job starts them ----------------------------------------------------------
    def new_layer(self, index: int) -> LayerState:
        # Built on the CPU (the seeded init is the CPU generator's), then moved: the same start on any device.
        return LayerState(index, build_layer(self.config.model, index, self.config.seed).to(self.device))

    def initial_layer(self, index: int) -> LayerState:
        """Layer `index` as the job starts: seeded, or loaded from `init_from`."""
        state = self.new_layer(index)
        if self.init is not None:
            self.init.apply(state)
        return state

    def transfer_bytes(self, index: int) -> int:
        """Bytes of layer `index`'s hand-over message (`LayerState.flat`: params and both AdamW
        moments in float64, plus the version); shapes only, built on the meta device."""
        if index not in self._state_bytes:
            with torch.device("meta"):
                module = build_layer(self.config.model, index, self.config.seed)
            self._state_bytes[index] = 8 * (3 * sum(p.numel() for p in module.parameters()) + 1)
        return self._state_bytes[index]

    def transfer_timeout(self, plan: GenerationPlan) -> float:
        """The bound of every call of this plan's hand-over (`JobConfig.transfer_timeout`), from all
        the bytes it moves: the same on every node."""
        return self.config.transfer_timeout(sum(self.transfer_bytes(layer) for layer, _, _ in plan.transfers))

    # -- one generation change ------------------------------------------------------------------
    def apply(self, plan: GenerationPlan, layout: Layout, held: Held) -> None:
        """Bring `held` (in place: what a failed hand-over received or dropped is what the next
        rendezvous hears this node holds) to exactly this node's layers of `layout` at the plan's
        start step; a leaving node keeps what it sends until its receivers train with it."""
        start = plan.start_step
        mine = layout.layers_of(self.node) if self.node in plan.members else set()
        for state in held.values():
            state.zero_grad()  # gradients of the interrupted step are partial: the step is redone
        if plan.restore_step is not None:
            held.clear()
            for i in sorted(mine):
                held[i] = self._restored(i, start)
            return
        for i, state in list(held.items()):
            if not self._at_step(state, start):
                del held[i]
        self._exchange(plan, held)
        if self.node in plan.leaving:
            return  # kept until the receivers are training with it (`await_receivers`)
        for i in sorted(mine):
            if i not in held:
                if start != self.init_step:
                    raise RuntimeError(f"layer {i} missing at step {start} and no transfer planned")
                held[i] = self.initial_layer(i)
        for i in list(held):
            if i not in mine:
                del held[i]

    def _restored(self, index: int, step: int) -> LayerState:
        if step <= self.init_step:
            return self.initial_layer(index)
        state = self.new_layer(index)
        self.checkpoints.load(step, state)
        return state

    @staticmethod
    def _at_step(state: LayerState, step: int) -> bool:
        """Whether `state` is usable at `step`, after rolling back a step applied past it."""
        if state.version == step + 1:
            state.rollback_to(step)
        return state.version == step

    def _exchange(self, plan: GenerationPlan, held: Held) -> None:
        """Send and receive this node's part of the plan's transfers (in place, into `held`)."""
        transfers = plan.transfers
        involved = sorted({n for _, src, dst in transfers for n in (src, dst)})
        if self.node not in involved:
            if transfers:
                self._transfer_fault(plan, 0, 0)
            return
        generation = plan.generation
        # Meet at the store first: a source that died after the plan was published is caught by
        # its heartbeat here, instead of hanging the group's construction for the full timeout.
        wait_ready(self.coord, f"{generation}/xfer", self.node, involved,
                   heartbeat_timeout_s=self.config.heartbeat_timeout_s, timeout_s=self.config.rendezvous_timeout_s,
                   abort_of=generation)
        # Every call is bounded by the transfer timeout, not the (short) op timeout: moving a big
        # layer legitimately takes longer than any message of a step. A peer killed mid-transfer
        # fails our calls at once (closed connection); one hung (SIGSTOP) is seen by its stale
        # heartbeat, or by a member giving the generation up, not at the bound.
        timeout = self.transfer_timeout(plan)
        moves = [t for t in transfers if self.node in t[1:]]
        peers = sorted({n for _, src, dst in moves for n in (src, dst)} - {self.node})
        began = time.perf_counter()
        # A short-lived group of its own (it may include leaving nodes, which then exit).
        comm = Comm(self.generation_store(generation), prefix="xfer", node=self.node, members=involved,
                    timeout_s=timeout, watch=lambda: self._trouble(generation, peers))
        try:
            for index, (layer, src, dst) in enumerate(moves):
                self._transfer_fault(plan, index, len(moves))
                if src == self.node:
                    comm.send(held[layer].flat(), dst, layer)
                else:
                    state = self.new_layer(layer)
                    buf = torch.empty(state.numel() + 1, dtype=torch.float64)
                    comm.recv(buf, src, layer)
                    state.load_flat(buf)
                    held[layer] = state
            self._transfer_fault(plan, len(moves), len(moves))
            comm.wait_sends()
        finally:
            comm.close()
        self._emit({"event": "transfer", "generation": generation,
                    "bytes": sum(self.transfer_bytes(layer) for layer, _, _ in moves), "timeout_s": timeout,
                    "seconds": time.perf_counter() - began})

    def _transfer_fault(self, plan: GenerationPlan, index: int, total: int) -> None:
        if self.faults:
            self.faults.at_transfer(plan, index, total, coord=self.coord, timeout_s=self.config.rendezvous_timeout_s)

    def _trouble(self, generation: int, peers: list[int]) -> str | None:
        """Why a hand-over wait should stop before its timeout: the generation was given up, or a
        peer we exchange state with is gone (dead mark, or no heartbeat: hung)."""
        why = self.coord.aborted(generation)
        if why is not None:
            return f"hand-over: generation {generation} was given up: {why}"
        gone = [n for n in peers if self.coord.is_gone(n, self.config.heartbeat_timeout_s)]
        if gone:
            return f"hand-over: peers {gone} of generation {generation} are gone (dead or no heartbeat)"
        return None

    def await_receivers(self, plan: GenerationPlan) -> None:
        """A leaving node that sent state stays until the generation that received it committed its
        first step. If that generation is given up first (a receiver or another member died during
        the hand-over), it still holds the state -- perhaps the only copy -- and raises, so it joins
        the next rendezvous (kept as `deferred` again if the job needs it) instead of leaving."""
        generation = plan.generation
        receivers = sorted({dst for _, src, dst in plan.transfers if src == self.node})
        deadline = time.monotonic() + self.config.rendezvous_timeout_s
        while not self.coord.started(generation) and not self.coord.is_over():
            why = self.coord.aborted(generation)
            if why is not None:
                raise RuntimeError(f"hand-over: generation {generation} was given up: {why}")
            gone = [n for n in receivers if self.coord.is_gone(n, self.config.heartbeat_timeout_s)]
            if gone:
                raise RuntimeError(f"hand-over: receivers {gone} of generation {generation} are gone")
            if time.monotonic() > deadline:  # the state was sent; do not outstay the notice for ever
                self._emit({"event": "handover_unconfirmed", "generation": generation})
                return
            time.sleep(0.005)
