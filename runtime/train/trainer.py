"""The trainer (its class is `Worker`): one process per node, living through generations without restarting.

Entry points for the node agent:
- `run_worker(spec, on_step=callback)` in-process, or
- `python -m runtime.train.trainer --spec JSON` (or `--spec @file.json`).

Life of a worker: join generation 0 (or, as a replacement, wait until a generation takes it), then
loop: set up the generation (roll back a half-applied step, restore or receive missing layer
states, build process groups and the schedule), run steps, and commit each with a small all-reduce
that also carries notices and join requests. A failed or timed-out call means a peer is dead or
hung: drop the groups (so every peer fails fast too), form the next generation through the store
and continue from the last committed step. A notice means: finish this step, hand over, leave.

This module is the worker's life across generations (start, regroup, finish, checkpoints, export);
one generation's steps are `runtime.train.loop`, bringing the layer states to a new plan is
`runtime.train.handover`, and the faults tests and benchmarks inject are `runtime.train.faults`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import math
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime.checkpointing.checkpoints import Checkpoints, checkpoint_root
from runtime.checkpointing.export import ExportError, InitialState, export_layers, model_entry
from runtime.config import USER_MODEL_KIND, JobConfig, LayoutError
from runtime.data.dataset import Batches, DataError
from runtime.distributed.comm import Comm
from runtime.distributed.coordinator import Coordinator, Heartbeat, connect
from runtime.distributed.generation_plan import GenerationPlan
from runtime.distributed.membership import initial_plan, make_plan
from runtime.models.load import initial_state
from runtime.models.model import build_layer
from runtime.parallel.device import DeviceUnavailable, Staging, resolve_device, use_device
from runtime.parallel.layout import Layout
from runtime.parallel.schedule import forward_schedule, job_durations
from runtime.strategies import get_strategy
from runtime.train.executor import Executor
from runtime.train.faults import FaultInjector
from runtime.train.handover import Handover
from runtime.train.loop import COMMIT_HEADER, train_generation
from runtime.train.optim import LayerState, held_bytes
from runtime.train.reference import named_parameters

StepCallback = Callable[[dict[str, Any]], None]


@dataclass(kw_only=True, slots=True)
class WorkerSpec:
    """What the node agent tells a worker to do."""

    job_id: str
    """Job identifier; prefixes every store key, so jobs can share a store."""
    node: int
    """This node's id (stable across generations; a replacement gets a new id)."""
    rendezvous: str
    """`host:port` of the job's TCPStore (hosted by the agent/control plane, not by a worker)."""
    config: dict[str, Any]
    """`JobConfig.to_dict()`."""
    generation: int = 0
    """Generation to start in: 0 at job start; a replacement is placed by the running job instead."""
    joining: bool = False
    """True for a replacement joining a running job."""
    out_dir: str = ""
    """If set: metrics (`metrics-<node>.jsonl`) and final parameters (`node-<node>.pt`) go here."""
    export_dir: str = ""
    """If set: the job's final weights and optimizer state go here as safetensors (`runtime.checkpointing.export`),
    each designated writer writing its layers' shards, with spotpipe.json beside them; and its
    checkpoints, in the same format, under `checkpoints/step-N/` (`runtime.checkpointing.checkpoints`)."""
    device_index: int = 0
    """Which of this VM's GPUs a `device = "cuda"` job uses (in `CUDA_VISIBLE_DEVICES` numbering; the
    agent's `--gpu-index`; local runs, whose nodes share the host's GPUs, use the node id modulo the
    GPU count). Ignored on the CPU."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    """Injected faults: {"kind": "kill"|"stop"|"notice"|"delay", "step": k, "at": action index or -1
    (mid-step), "delay_s": seconds for "delay"}; with "phase": "transfer", during a state hand-over
    instead (`runtime.train.faults`)."""


class Fenced(RuntimeError):
    """This node was declared gone by the others (e.g. it was hung too long); it must exit."""


class JobCannotContinue(RuntimeError):
    """The job's members agreed that no next generation can run (e.g. the last holder of a stage
    died with no replica, checkpoint or replacement). `reason` names what is missing; every worker
    exits with it and supervisors report it (the control plane marks the job failed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when our parent dies, so no worker is ever orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Worker:
    """One node's training loop across generations (see the module docstring)."""

    def __init__(self, spec: WorkerSpec, on_step: StepCallback | None = None) -> None:
        self.spec = spec
        self.node = spec.node
        self.config = JobConfig.from_dict(spec.config)
        self.config.validate()
        self.strategy = get_strategy(self.config.strategy)
        self.on_step = on_step
        self.held: dict[int, LayerState] = {}
        self.committed = 0
        self.skipped_steps = 0
        """Committed steps this process saw skipped for a non-finite gradient (every node skips alike)."""
        self.skipped_at: list[int] = []
        """The job's committed steps skipped for a non-finite gradient, from its start (not only this
        process's): the history an fp16 loss scale is computed from (`runtime.train.loss_scale`),
        handed to joiners in each plan and recorded in checkpoints."""
        self.notice = False
        self.faults = FaultInjector(spec.faults, emit=self.emit, give_notice=self.give_notice) if spec.faults else None
        """Injected faults (tests and benchmarks only, `runtime.train.faults`); None in production."""
        self.handover: Handover | None = None
        """This node's side of every generation change (`runtime.train.handover`), once `run` opened
        the store, the device and the initial state."""
        self.comm: Comm | None = None
        self.out = Path(spec.out_dir) if spec.out_dir else None
        # Every strategy writes checkpoints (the plan says when): `checkpoint` restarts from them
        # after any change, recycle/bamboo/oobleck only when a change lost every copy of a layer.
        self.ckpt = Checkpoints(checkpoint_root(export_dir=spec.export_dir, checkpoint_dir=self.config.checkpoint_dir,
                                                out_dir=spec.out_dir, job_id=spec.job_id))
        self.ckpt_cost_s: float | None = None
        """Seconds this node's last checkpoint write took (None: it wrote none yet)."""
        self.saved_step: int | None = None
        self.step_times: list[float] = []
        self.slowest_per_unit: float | None = None
        """The slowest committed step's seconds per unit of its layout's estimated length
        (`schedule_length`): what a step of any layout is expected to take (`step_timeout`)."""
        self._first_step_s: float | None = None
        self.init: InitialState | None = None
        self.init_step = 0
        """The step generation 0 starts at: the `init_from` export's steps_done when it continues one."""
        self.layout: Layout | None = None
        self.device = torch.device("cpu")
        """Where this node computes (`_open_device`)."""
        self.staging: Staging | None = None

    # -- reporting ----------------------------------------------------------------------------
    def emit(self, record: dict[str, Any]) -> None:
        """Record an event or a step's metrics (`metrics-<node>.jsonl`; steps also to `on_step`)."""
        record = {"node": self.node, "time": time.time(), **record}
        if self.out is not None:
            with open(self.out / f"metrics-{self.node}.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
        if self.on_step is not None and "step" in record and "event" not in record:
            self.on_step(record)

    def give_notice(self) -> None:
        """This node is about to go (SIGTERM from its agent, or an injected notice): finish the
        step, hand over, leave."""
        self.notice = True

    # -- the main loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train until `config.steps` are committed or this node leaves; returns a summary."""
        torch.set_num_threads(1)
        spec, cfg = self.spec, self.config
        store = connect(spec.rendezvous, timeout_s=cfg.rendezvous_timeout_s)
        self.coord = Coordinator(store, spec.job_id)
        self.store = store
        heartbeat = Heartbeat(spec.rendezvous, spec.job_id, self.node, cfg.heartbeat_timeout_s / 5)
        try:
            self._open_device()
            self.batches = self._open_data()
            self._open_init()
            self._check_model()
            self.handover = Handover(
                config=cfg, node=self.node, device=self.device, coord=self.coord,
                generation_store=self.store_prefix, checkpoints=self.ckpt, init=self.init,
                init_step=self.init_step, emit=self.emit, faults=self.faults,
            )
            plan = self._join() if spec.joining else self._first_plan()
            if plan is None:
                return {"node": self.node, "outcome": "too_late", "committed": 0}
            while True:
                if plan.error is not None:
                    reason = f"generation {plan.generation} cannot run: {plan.error}"
                    self.coord.mark_failed(reason)  # replacements still waiting to join give up too
                    self.emit({"event": "job_failed", "reason": reason})
                    raise JobCannotContinue(reason)
                if self.node not in plan.members and self.node not in plan.leaving:
                    raise Fenced(f"node {self.node} is not a member of generation {plan.generation}")
                self.emit(
                    {
                        "event": "generation",
                        "generation": plan.generation,
                        "start_step": plan.start_step,
                        "reason": plan.reason,
                        "lost": plan.lost,
                        "leaving": plan.leaving,
                        "joined": plan.joined,
                        "members": plan.members,
                        "deferred": plan.deferred,
                    }
                )
                outcome, reason = self._run_generation(plan)
                if outcome != "failure" and self.comm is not None:
                    # The first member's last commit totals may still be on their way. Ending the
                    # process before they are delivered would reset them, and a group closed with
                    # a send pending stays parked (and its sockets and threads with it) for good.
                    self.comm.settle_sends()
                if outcome in ("done", "left", "stopped"):
                    self._finish(outcome)
                    return {"node": self.node, "outcome": outcome, "committed": self.committed}
                self._close_comm()
                if outcome == "failure":
                    self.emit({"event": "failure_detected", "generation": plan.generation, "reason": reason})
                if self.coord.is_done():
                    # The others committed the last step and finished while this generation failed
                    # here: there is nobody left to regroup with, and the job's result is theirs.
                    self.emit({"event": "job_done_without_us", "committed": self.committed})
                    return {"node": self.node, "outcome": "done_elsewhere", "committed": self.committed}
                plan = self._next_plan(plan, reason, graceful=outcome == "graceful")
        finally:
            heartbeat.stop()
            self.emit({"event": "heartbeat_stats", "max_gap_s": heartbeat.max_gap_s})
            self._close_comm()

    def _first_plan(self) -> GenerationPlan:
        """The plan of the generation this node starts in (published by the first node to get here)."""
        plan = self.coord.read_plan(self.spec.generation)
        if plan is None:
            plan = self.coord.publish_plan(
                self.spec.generation,
                initial_plan(self.config, start_step=self.init_step, started_at=time.time()),
            )
        return plan

    def _join(self) -> GenerationPlan | None:
        """As a replacement: ask to join, and wait until a generation takes this node (None: the job
        ended first). With no empty slot it stands by outside the group meanwhile."""
        cfg = self.config
        ready = time.time()
        self.coord.request_join(self.node)
        self.emit({"event": "join_requested", "ready_time": ready})
        taken = self.coord.wait_joined(self.node, cfg.rendezvous_timeout_s)
        if taken is not None:
            if not self.coord.store.check([f"joined/{self.node}"]):
                # No empty slot for us: stand by outside the group (heartbeating, so the plan that
                # next finds a hole -- a member dies or leaves -- takes us) until a generation takes
                # us or the job ends. No bound: idling is the control plane's call (it can stop the
                # node); the others never wait for a spare.
                self.emit({"event": "spare", "generation": taken})
            taken = self.coord.wait_joined(self.node, None, spare=False)
        failed = self.coord.failure()
        if failed is not None:
            self.emit({"event": "job_failed", "reason": failed})
            raise JobCannotContinue(failed)
        if taken is None:
            self.emit({"event": "join_too_late"})
            return None
        plan = self.coord.read_plan(taken)
        assert plan is not None, f"generation {taken} took node {self.node} but has no plan"
        return plan

    def _open_device(self) -> None:
        """This node's device (`JobConfig.device`, the spec's GPU index). A node that cannot use the
        device the job asks for fails the job: every node of a job gets the same kind of VM, so a
        replacement would fail the same way."""
        try:
            self.device = resolve_device(self.config, self.spec.device_index)
        except DeviceUnavailable as exc:
            reason = f"device: {exc}"
            self.coord.mark_failed(reason)
            self.emit({"event": "job_failed", "reason": reason})
            raise JobCannotContinue(reason) from None
        use_device(self.device)
        self.staging = Staging(self.device)

    def _open_data(self) -> Batches:
        """The job's data on this node (tokenized into the node's cache by the first rank to get
        here). Data this node cannot use fails the job: no retry or replacement can fix it."""
        try:
            return Batches(self.config)
        except DataError as exc:
            reason = f"data: {exc}"
            self.coord.mark_failed(reason)
            self.emit({"event": "job_failed", "reason": reason})
            raise JobCannotContinue(reason) from None

    def _open_init(self) -> None:
        """The weights the job starts from (`init_from`), when set; one this node cannot read fails
        the job (no retry or replacement can fix it)."""
        if not self.config.init_from:
            return
        try:
            self.init = initial_state(self.config.init_from, self.config.model)
        except (ExportError, OSError) as exc:
            reason = f"init_from: {exc}"
            self.coord.mark_failed(reason)
            self.emit({"event": "job_failed", "reason": reason})
            raise JobCannotContinue(reason) from None
        self.init_step = self.init.start_step
        self.skipped_at = self.init.skipped_at

    def _check_model(self) -> None:
        """A user's model is validated again here, before any generation forms (its import, return
        type, layers, initialisation and shapes); a model this node cannot build fails the job once.
        A contract without `model.layers` (not validated by a client) gets it here: every rank finds
        the same count, and the stages are split evenly (no profiled `layer_costs`)."""
        if self.config.model.kind != USER_MODEL_KIND:
            return
        from runtime.train.model_check import validate_model

        try:
            validate_model(self.config, batches=self.batches, profile=False).record(self.config)
            self.config.validate()
        except LayoutError as exc:
            reason = f"model: {exc}"
            self.coord.mark_failed(reason)
            self.emit({"event": "job_failed", "reason": reason})
            raise JobCannotContinue(reason) from None

    def validate(self, executor: Executor, layout: Layout, members: list[int], step: int, generation: int) -> None:
        """The held-out loss of the parameters after `step` steps, computed by the pipeline without a
        backward pass, summed over the members like a step's loss; every member emits it. The first
        member records it in the store, so a generation that fails after this does not redo it."""
        started = time.perf_counter()
        actions = forward_schedule(layout).get(self.node, [])
        if self.faults:
            executor.hook = self.faults.step_hook(step, phase="validation")
        total = torch.zeros(2, dtype=torch.float64)
        for batch in range(self.config.data.val_batches):
            result = executor.run_validation(batch, actions)
            total[0] += result.loss_sum
            total[1] += result.loss_count
        self.comm.commit(total)
        if members.index(self.node) == 0:
            self.coord.store.set(f"val/{step}", "1")
        self.emit({"step": step - 1, "generation": generation, "val_loss": float(total[0] / max(total[1], 1)),
                    "val_time_s": time.perf_counter() - started})

    def _close_comm(self) -> None:
        if self.comm is not None:
            parked = self.comm.close()
            self.comm = None
            self.emit({"event": "groups_closed", "parked": parked})

    def _next_plan(self, previous: GenerationPlan, reason: str, *, graceful: bool) -> GenerationPlan:
        cfg = self.config
        generation = previous.generation + 1
        if (graceful and self.strategy.restarts_from_checkpoint and previous.waiting is None
                and self.saved_step != self.committed):
            # At a graceful boundary every member is here: a checkpoint now loses no step.
            self.save_checkpoint(previous.layout, self.committed, previous.generation)
        recent = self.step_times[-20:]
        record = {
            "committed": self.committed,
            "versions": {str(i): st.version for i, st in self.held.items()},
            "leaving": self.notice,
            # What the next checkpoint interval is computed from (`runtime.checkpointing.durability`).
            "checkpoint_cost_s": self.ckpt_cost_s,
            "step_time_s": sorted(recent)[len(recent) // 2] if recent else None,
            "skipped_at": self.skipped_at,
        }

        decided: list[float] = []

        def decide(records: dict[int, dict[str, Any]]) -> GenerationPlan:
            began = time.perf_counter()
            try:
                return _decide(records)
            finally:
                decided.append(time.perf_counter() - began)

        def _decide(records: dict[int, dict[str, Any]]) -> GenerationPlan:
            joiners = self.coord.joiners(previous.joins_consumed, self.coord.join_count())
            # Spares stand by outside the group; one that died (dead mark, stale heartbeat) is dropped.
            spares = [n for n in previous.spare if not self.coord.is_gone(n, cfg.heartbeat_timeout_s)]
            step = self.ckpt.latest()
            if self.init_step and (step is None or step < self.init_step):
                step = self.init_step  # nothing saved since the job's start from init_from
            plan = make_plan(
                cfg,
                generation=generation,
                previous=previous,
                alive=records,
                joiners=joiners,
                checkpoint_step=step,
                reason=reason,
                spares=spares,
                now=time.time(),
                # A joiner told to stand by (no slot, or held for a batch) may have died since.
                gone_joiners=[n for n in joiners if self.coord.is_gone(n, cfg.heartbeat_timeout_s)],
            )
            if plan.start_step is not None:  # the skips before it, which every member that committed them knows
                plan = dataclasses.replace(plan, skipped_at=sorted({
                    int(s) for rec in records.values() for s in rec.get("skipped_at", ()) if int(s) < plan.start_step}))
            return plan

        began = time.perf_counter()
        plan = self.coord.form_generation(
            generation,
            node=self.node,
            record=record,
            # A node that was leaving is expected too: if its hand-over failed it still holds the
            # state it was handing over (one that did leave marked itself `left`, so is not waited for).
            expected=[*previous.members, *previous.leaving],
            decide=decide,
            heartbeat_timeout_s=cfg.heartbeat_timeout_s,
            timeout_s=cfg.rendezvous_timeout_s,
            answer_timeout_s=cfg.op_timeout_s,
        )
        # Where a regroup's time goes (`bench runtime`'s breakdown): waiting on the store for every
        # survivor's answer, and the plan itself (`decide_s`, on the member that computed it).
        self.emit({"event": "regroup", "generation": generation, "form_s": time.perf_counter() - began,
                    "decide_s": decided[0] if decided else None})
        return plan

    # -- one generation -----------------------------------------------------------------------
    def _run_generation(self, plan: GenerationPlan) -> tuple[str, str]:
        try:
            return self._generation_body(plan)
        except DataError as exc:  # a streamed shard that went away or changed: no retry can fix it
            reason = f"data: {exc}"
            self.coord.mark_failed(reason)
            self.emit({"event": "job_failed", "reason": reason})
            if self.comm is not None:
                self.comm.poison_commit(COMMIT_HEADER + len(plan.members))
            raise JobCannotContinue(reason) from None
        except (RuntimeError, TimeoutError) as exc:
            if isinstance(exc, Fenced | JobCannotContinue):
                raise
            if self.comm is not None:
                self.comm.poison_commit(COMMIT_HEADER + len(plan.members))
            reason = f"{type(exc).__name__}: {str(exc)[-300:]}"
            # Members still setting this generation up (in a hand-over or a store barrier, where no
            # gloo call of ours can wake them) stop waiting for us now rather than at their timeout.
            with contextlib.suppress(Exception):
                self.coord.abort(plan.generation, f"node {self.node}: {reason}")
        return "failure", reason

    def _wait_for_joiners(self, plan: GenerationPlan) -> tuple[str, str]:
        """Too few members for one pipeline (a strategy that restarts from its checkpoint): hold,
        heartbeating, until a replacement asks to join, then regroup with it."""
        if self.node in plan.leaving:
            return "left", "notice"
        deadline = time.monotonic() + self.config.join_wait_s
        while self.coord.join_count() <= plan.joins_consumed:
            failed = self.coord.failure()
            if failed is not None:  # another member found the job cannot go on
                raise JobCannotContinue(failed)
            if self.coord.stop_requested():  # nothing to checkpoint: the state is incomplete
                return "stopped", "stop requested while waiting for replacements"
            if self.coord.is_done():  # the others finished it: no replacement will come
                return "failure", "the job finished while this generation waited for replacements"
            if time.monotonic() > deadline:
                reason = (
                    f"generation {plan.generation} waited {self.config.join_wait_s:.0f} s for replacements "
                    f"and none joined: {plan.waiting}"
                )
                self.coord.mark_failed(reason)
                self.emit({"event": "job_failed", "reason": reason})
                raise JobCannotContinue(reason)
            time.sleep(0.05)
        return "graceful", "join"

    def _generation_body(self, plan: GenerationPlan) -> tuple[str, str]:
        if plan.waiting is not None:
            return self._wait_for_joiners(plan)
        layout = plan.layout
        assert layout is not None, f"generation {plan.generation} has neither a layout nor a wait"
        self.layout = layout
        self.handover.apply(plan, layout, self.held)
        self._take_history(plan)
        if self.node in plan.leaving:
            if any(src == self.node for _, src, _ in plan.transfers):
                self.handover.await_receivers(plan)
            return "left", "notice"
        return train_generation(self, plan, layout)

    def _take_history(self, plan: GenerationPlan) -> None:
        """The job's skipped steps before the plan's start: a checkpoint's own record when the plan
        restores one (its members may all be replacements), else the plan's (a joiner learns them
        there); the first generation keeps what `init_from` recorded."""
        restore = plan.restore_step
        if restore is not None and restore > self.init_step:
            self.skipped_at = self.ckpt.reader(restore).skipped_at
        elif restore is not None:
            self.skipped_at = self.init.skipped_at if self.init is not None else []
        elif plan.skipped_at is not None:
            self.skipped_at = list(plan.skipped_at)

    def step_timeout(self, unit: float, executor: Executor) -> float:
        """The bound of every call of this node's next step (`JobConfig.step_timeout`): from the
        slowest step measured so far, scaled to this layout's estimated length `unit` (a degraded
        layout that gives a survivor twice the work expects a step twice as long); before any
        measurement, `first_step_timeout` of the step's work."""
        cfg = self.config
        if self.slowest_per_unit is not None and unit > 0:
            return cfg.step_timeout(self.slowest_per_unit * unit, first_s=0.0)
        if self._first_step_s is None:
            flop = 0.0 if cfg.first_step_timeout_s > 0 else self._step_flop(executor)
            self._first_step_s = cfg.first_step_timeout(flop)
        return cfg.step_timeout(None, first_s=self._first_step_s)

    def checkpoint_allowance(self, layout: Layout) -> float:
        """How much longer than a step the calls of the step after a checkpoint may wait: the
        slowest writer's share written at the hand-over bound (`JobConfig.transfer_timeout` of its
        layers' state bytes, counted in float64 as a hand-over message: an over-estimate), the same
        on every node. Tiny models: about op_timeout_s; GPT-2's stage 0 (813 MB in float32): about 34 s."""
        shares: dict[int, int] = {}
        for layer, writer in self._writers(layout).items():
            shares[writer] = shares.get(writer, 0) + self.handover.transfer_bytes(layer)
        return self.config.transfer_timeout(max(shares.values(), default=0))

    def _step_flop(self, executor: Executor) -> float:
        """A step's floating-point operations, roughly: 6 x the model's parameters x the tokens of
        the global batch (a forward is 2 per parameter and token, its backward 4). Tokens per
        sample: the first layer's input elements per sample (token ids), or per feature vector
        (float inputs, features last). An over-estimate is harmless: this only bounds a first step."""
        cfg = self.config
        params = sum((self.handover.transfer_bytes(i) // 8 - 1) // 3 for i in range(executor.layout.num_layers))
        shape, dtype = executor.boundaries[0]
        per_sample = math.prod(shape[1:]) if len(shape) > 1 else 1
        if dtype.is_floating_point and len(shape) > 1:
            per_sample //= max(shape[-1], 1)
        return 6.0 * params * cfg.global_batch * max(per_sample, 1)

    def peer_hung(self, peer: int | None, members: list[int]) -> str | None:
        """Why a step's wait for `peer` (None: any member) should stop before its bound: the peer is
        gone (dead mark from a supervisor, or heartbeat older than `heartbeat_timeout_s`: hung)."""
        peers = [peer] if peer is not None else [n for n in members if n != self.node]
        gone = [n for n in peers if self.coord.is_gone(n, self.config.heartbeat_timeout_s)]
        if gone:
            return f"peers {gone} are gone (dead, or no heartbeat for {self.config.heartbeat_timeout_s}s: hung)"
        return None

    def store_prefix(self, generation: int) -> dist.Store:
        """The store namespace of one generation's groups."""
        return dist.PrefixStore(f"{self.spec.job_id}/gen/{generation}", self.store)

    def durations(self, layout: Layout):
        return job_durations(self.config, layout)

    # -- checkpoints and the final export ------------------------------------------------------
    @staticmethod
    def _writers(layout: Layout) -> dict[int, int]:
        """Layer -> its designated writer in `layout` (the first owner of each owner run), for
        checkpoints and the final export alike."""
        return {i: owners[0] for lo, hi, owners in layout.owner_runs() if owners for i in range(lo, hi)}

    def _meta_layers(self, writers: dict[int, int]) -> dict[int, nn.Module]:
        """The written layers built on the meta device: the shapes an export's shard plan needs
        (`runtime.checkpointing.export.distributed_plans`), with no memory."""
        with torch.device("meta"):
            return {i: build_layer(self.config.model, i, 0) for i in sorted(writers)}

    def _export_info(self, steps_done: int) -> dict[str, Any]:
        """spotpipe.json of an export or checkpoint after `steps_done` steps."""
        cfg = self.config
        return {
            "model": model_entry(cfg.model),
            "config": cfg.to_dict(),
            "tokenizer": cfg.data.tokenizer if cfg.data.source else None,
            "steps_done": steps_done,
            "skipped_steps_at": [s for s in self.skipped_at if s < steps_done],
        }

    def save_checkpoint(self, layout: Layout, step: int, generation: int) -> None:
        """Write this node's share of the checkpoint of `step` (the layers it is the designated
        writer of) and time it: the write's duration is the checkpoint cost of the next interval."""
        writers = self._writers(layout)
        if self.node not in writers.values():
            return
        began = time.perf_counter()
        complete = self.ckpt.write(
            step, spec=self.config.model, layers=self._meta_layers(writers), writers=writers, node=self.node,
            states=self.held,
            # The generation in the id: shards an earlier attempt at this step left never count.
            export_id=f"{self.spec.job_id}/checkpoint/{step}/{generation}", info=self._export_info(step),
            max_shard_bytes=self.config.export_shard_bytes,
        )
        self.ckpt_cost_s = time.perf_counter() - began
        self.saved_step = step
        self.emit({"event": "checkpoint", "step": step, "generation": generation, "seconds": self.ckpt_cost_s,
                    "complete": complete, "dir": self.ckpt.step_dir(step)})

    def _finish(self, outcome: str) -> None:
        if outcome == "left":
            self.coord.mark_left(self.node)  # the others stop expecting us at a rendezvous
        self._emit_held_state()
        self.emit({"event": outcome, "committed": self.committed})
        if outcome == "done":
            self.coord.mark_done()
        elif outcome == "stopped":
            self.coord.mark_stopped()
        if self.out is not None and outcome == "done":
            torch.save(
                {
                    "params": named_parameters(self.held),
                    "versions": {i: s.version for i, s in self.held.items()},
                },
                self.out / f"node-{self.node}.pt",
            )
        if self.spec.export_dir and outcome == "done":
            self._export()

    def _emit_held_state(self) -> None:
        """What this process holds at its end: its layers and their state's bytes (`held_bytes`),
        and its peak resident memory (informative: it includes the Python and torch runtime)."""
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        self.emit({"event": "held_state", "layers": sorted(self.held), **held_bytes(self.held.values()),
                    "peak_rss_bytes": peak_kib * 1024})

    def _export(self) -> None:
        """Write this node's share of the job's final weights and optimizer state (`runtime.checkpointing.export`):
        the layers it is the designated writer of in the final layout (first owner of each run). The
        node that completes the export also writes the job's other `export` format beside it (`hf/`);
        a failure there is reported in the event, and the weights stand."""
        assert self.layout is not None
        writers = self._writers(self.layout)
        complete = export_layers(
            self.spec.export_dir, layers=self._meta_layers(writers), writers=writers, node=self.node,
            states=self.held, steps_done=self.committed, export_id=f"{self.spec.job_id}/{self.committed}",
            info=self._export_info(self.committed), max_shard_bytes=self.config.export_shard_bytes,
        )
        event: dict[str, Any] = {"event": "exported", "dir": self.spec.export_dir, "complete": complete}
        if complete and self.config.export == "hf":
            from runtime.train.hf_folder import write_hf_beside

            try:
                event["hf"] = write_hf_beside(self.spec.export_dir)
            except (ExportError, OSError) as exc:
                event["hf_error"] = str(exc)
        self.emit(event)


def run_worker(spec: WorkerSpec, on_step: StepCallback | None = None) -> dict[str, Any]:
    """Run one node until the job ends or the node leaves; `on_step(metrics)` after every committed step."""
    return Worker(spec, on_step).run()


def main(argv: list[str] | None = None) -> int:
    """`python -m runtime.train.trainer --spec JSON|@file`."""
    parser = argparse.ArgumentParser(prog="python -m runtime.train.trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="WorkerSpec as JSON, or @path to a JSON file")
    args = parser.parse_args(argv)
    text = Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec
    _die_with_parent()
    worker = Worker(WorkerSpec(**json.loads(text)), on_step=lambda m: print(json.dumps(m), flush=True))

    def on_sigterm(signum: int, frame: object) -> None:
        # SIGTERM is how an agent forwards a preemption notice.
        worker.give_notice()

    signal.signal(signal.SIGTERM, on_sigterm)
    summary = worker.run()
    print(json.dumps(summary), flush=True)
    return 0


def spec_json(spec: WorkerSpec) -> str:
    """The JSON form `main` accepts."""
    return json.dumps(asdict(spec))


if __name__ == "__main__":
    sys.exit(main())
