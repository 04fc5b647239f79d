"""One generation's training, once its state is in place (`runtime.train.handover`): meet the other
members, build the generation's groups, schedule and executor, then run steps and commit each with
one small all-reduce that also carries notices, join requests and a stop asked. It ends when the
job is done ("done"), a notice or joiners ask for a regroup ("graceful"), or a stop was asked
("stopped"); a failed call raises, and the worker forms the next generation."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.checkpointing.durability import checkpoint_due
from runtime.distributed.comm import Comm, bury, reap
from runtime.distributed.coordinator import Coordinator, wait_ready
from runtime.distributed.generation_plan import GenerationPlan
from runtime.distributed.membership import joiners_worth_a_regroup
from runtime.parallel.layout import Layout
from runtime.parallel.schedule import build_schedule, schedule_length
from runtime.train.executor import Executor, StepResult
from runtime.train.loss_scale import loss_scale_at

if TYPE_CHECKING:
    from runtime.config import JobConfig
    from runtime.train.trainer import Worker

COMMIT_HEADER = 4
"""The step commit's fixed entries (loss sum, loss count, joiners worth a regroup, stop asked), before
one notice flag per member: what one all-reduce makes every member agree on."""


@dataclass(kw_only=True, slots=True)
class GenerationRun:
    """What a generation's steps run with (`open_generation`)."""

    plan: GenerationPlan
    layout: Layout
    members: list[int]
    index: int
    """This node's place among the members (the first member speaks for the joiners)."""
    executor: Executor
    actions: list
    unit: float
    """The layout's estimated step length, in the units step timeouts scale with."""
    bound: float
    """The bound of every call of the next step."""


def train_generation(worker: Worker, plan: GenerationPlan, layout: Layout) -> tuple[str, str]:
    """Run `plan`'s generation on this (member) node until it ends: (outcome, reason)."""
    run = open_generation(worker, plan, layout)
    start = plan.start_step
    if worker.config.validation_due(start) and not worker.coord.store.check([f"val/{start}"]):
        worker.validate(run.executor, layout, run.members, start, plan.generation)  # the failed generation did not
    return run_steps(worker, run)


def open_generation(worker: Worker, plan: GenerationPlan, layout: Layout) -> GenerationRun:
    """Meet the other members (the ones not in a hand-over wait here while it runs), build the
    generation's process groups, this node's schedule and its executor, and bound the first step."""
    cfg, generation, members = worker.config, plan.generation, plan.members
    began = time.perf_counter()
    wait_ready(
        worker.coord, generation, worker.node, members, heartbeat_timeout_s=cfg.heartbeat_timeout_s,
        # A legitimately long hand-over (big layers) must not run them out of time; a hung one is
        # caught by heartbeat or abort.
        timeout_s=cfg.rendezvous_timeout_s + (worker.handover.transfer_timeout(plan) if plan.transfers else 0.0),
        abort_of=generation,
    )
    ready = time.perf_counter()
    worker.comm = Comm(worker.store_prefix(generation), prefix="pg", node=worker.node, members=members,
                       timeout_s=cfg.op_timeout_s)
    built = time.perf_counter()
    actions = build_schedule(layout, cfg.schedule, worker.durations(layout)).get(worker.node, [])
    worker.emit({"event": "generation_ready", "generation": generation, "barrier_s": ready - began,
                 "group_s": built - ready, "schedule_s": time.perf_counter() - built})
    executor = Executor(cfg, layout, worker.node, worker.held, worker.comm, worker.batches, worker.staging)
    # Hang detection scales with the step (docs/runtime.md "Timeouts"): every call of a step is
    # bounded by a few times the step time this layout is expected to take, from the slowest
    # step measured so far; a wait bounded by more than the heartbeat timeout also gives up as
    # soon as the awaited peer's heartbeat is stale (hung), so long bounds do not slow that down.
    unit = schedule_length(layout, cfg.schedule, worker.durations(layout))
    worker.comm.peer_watch = lambda peer: worker.peer_hung(peer, members)
    worker.comm.watch_above_s = cfg.heartbeat_timeout_s
    bound = worker.step_timeout(unit, executor)
    worker.comm.set_timeout(bound)
    worker.emit({"event": "step_timeout", "generation": generation, "op_timeout_s": bound})
    return GenerationRun(plan=plan, layout=layout, members=members, index=members.index(worker.node),
                         executor=executor, actions=actions, unit=unit, bound=bound)


class JoinWatch:
    """The first member's look, at each step, at the replacements asking to join and at a stop asked.

    Join requests up to `told` are dealt with. The one rule (`joiners_worth_a_regroup`) says whether
    the joiners waiting are worth a regroup now; those not taken yet (no empty slot, or too few for a
    strategy whose regroup is a restart) the first member tells to stand by itself, rather than have
    everyone regroup just to say it. The next plan, whatever forms it, still sees them among the
    joiners since `joins_consumed`."""

    def __init__(self, plan: GenerationPlan, config: JobConfig, coord: Coordinator) -> None:
        self.plan, self.config, self.coord = plan, config, coord
        self.told = plan.joins_consumed
        slot_nodes = [n for row in plan.slots for n in row]
        self.slots = len(slot_nodes)
        self.filled = sum(n is not None for n in slot_nodes)
        self.standing_by = len(plan.spare)
        self.urgent = bool(plan.deferred)
        self.first_waiting: float | None = None
        """When this member first saw a joiner of this generation waiting."""

    def signals(self) -> tuple[float, float]:
        """(joiners worth a regroup now, or 0; 1 if a limit asked the job to stop, else 0)."""
        cfg, generation = self.config, self.plan.generation
        pending = self.coord.join_count()
        waiting, now = pending - self.plan.joins_consumed, time.monotonic()
        if waiting > 0 and self.first_waiting is None:
            self.first_waiting = now
        regroup = 0.0
        if waiting > 0 and joiners_worth_a_regroup(
                cfg.strategy, pp=cfg.pp, filled=self.filled, empty=self.slots - self.filled,
                waiting=waiting + self.standing_by, urgent=self.urgent, waited_s=now - (self.first_waiting or now),
                wait_bound_s=cfg.join_batch_wait_s):
            regroup = float(waiting)
        elif pending > self.told:
            for joiner in self.coord.joiners(self.told, pending):
                self.coord.tell_spare(joiner, generation)
            self.told = pending
        # A limit asked the job to stop: the commit makes every member stop at this step.
        return regroup, float(self.coord.stop_requested())


def run_steps(worker: Worker, run: GenerationRun) -> tuple[str, str]:
    """Run and commit steps from the plan's start until the generation ends (module docstring)."""
    cfg, plan = worker.config, run.plan
    generation = plan.generation
    deferred = set(plan.deferred)
    # A node that handed its state over may go once the generation that took it has committed a step.
    handover = any(src in plan.leaving for _, src, _ in plan.transfers)
    watch = JoinWatch(plan, cfg, worker.coord) if run.index == 0 else None
    step = plan.start_step
    worker.committed = step
    while step < cfg.steps:
        started = time.perf_counter()
        if worker.faults:
            run.executor.hook = worker.faults.step_hook(step)
        result = run.executor.run_step(step, run.actions, loss_scale_at(cfg, step, worker.skipped_at))
        if not worker.notice and worker.coord.notice_pending(worker.node):
            worker.notice = True
        vector = torch.zeros(COMMIT_HEADER + len(run.members), dtype=torch.float64)
        vector[0], vector[1] = result.loss_sum, result.loss_count
        if watch is not None:
            vector[2], vector[3] = watch.signals()
        # A deferred node already told the others; it leaves once a replacement joins.
        vector[COMMIT_HEADER + run.index] = float(worker.notice and worker.node not in deferred)
        worker.comm.commit(vector)
        if step == plan.start_step:
            bury()  # the previous generation's groups, once their calls have failed
            if handover and run.index == 0:
                worker.coord.mark_started(generation)
        elif step == plan.start_step + 1:
            reap()  # groups given up after failures, beyond a few (off the recovery path)
        step += 1
        _record_step(worker, run, step, vector, result, time.perf_counter() - started)
        if cfg.validation_due(step):
            worker.validate(run.executor, run.layout, run.members, step, generation)
        if vector[3] > 0 and step < cfg.steps:
            if worker.saved_step != step:
                worker.save_checkpoint(run.layout, step, generation)
            return "stopped", "stop requested"
        notices = vector[COMMIT_HEADER:].sum() > 0
        if vector[2] > 0 or notices:
            return "graceful", "notice" if notices else "join"
    return "done", ""


def _record_step(worker: Worker, run: GenerationRun, step: int, vector: torch.Tensor, result: StepResult,
                 elapsed: float) -> None:
    """After step `step - 1` committed: count it, write a checkpoint when one is due, bound the
    next step from what this one took, and emit the step's metrics."""
    cfg, generation = worker.config, run.plan.generation
    if result.skipped:
        worker.skipped_at.append(step - 1)
    worker.committed = step
    worker.skipped_steps += int(result.skipped)
    worker.step_times.append(elapsed)
    step_bound = run.bound
    if run.unit > 0:
        worker.slowest_per_unit = max(worker.slowest_per_unit or 0.0, elapsed / run.unit)
    run.bound = worker.step_timeout(run.unit, run.executor)
    if checkpoint_due(step, cfg.steps, every=run.plan.checkpoint_every, start_step=run.plan.start_step):
        worker.save_checkpoint(run.layout, step, generation)
        # The writers write their shares after the commit: the next step's first messages
        # from a writer come that much later, which its step time did not measure.
        run.bound += worker.checkpoint_allowance(run.layout)
    worker.comm.set_timeout(run.bound)
    worker.emit({
        "step": step - 1,
        "generation": generation,
        "loss": float(vector[0] / max(vector[1], 1)),
        "step_time_s": elapsed,
        "op_timeout_s": step_bound,
        "samples_per_s": cfg.global_batch / elapsed,
        "stage_times_s": {str(k): v for k, v in result.stage_time_s.items()},
        "members": len(run.members),
        # inf/NaN as null: the record stays strict JSON (`skipped` says why)
        "grad_norm": result.grad_norm if result.grad_norm is not None and math.isfinite(result.grad_norm) else None,
        "skipped": result.skipped,
        "skipped_steps": worker.skipped_steps,
    })
