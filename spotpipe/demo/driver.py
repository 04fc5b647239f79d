"""Submits the demo's training job and drives it: fires the scheduled preemptions on the local
provider's nodes, and shows the job's progress and its timeline (JobEvent rows) as they happen.

The driver only reads the database and pokes the nodes from outside, as a cloud would: a notice
goes to the node's metadata endpoint (the agent sees it and tells the control plane), a kill pulls
the plug (the control plane finds out from missing heartbeats). Everything else is the control
plane's own work, done by the Celery worker and beat."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from django.db import transaction
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import (
    ACTIVE_JOB_STATUSES,
    JobEvent,
    JobGeneration,
    JobStatus,
    MetricSample,
    Reconfiguration,
    TrainingJob,
)
from controlplane.jobs.services import job_submit
from controlplane.orchestration.providers import ProviderError
from controlplane.orchestration.providers.local.provider import LocalProvider
from runtime.config import MODEL_PRESETS
from spotpipe.demo.learning import corpus_source
from spotpipe.demo.preemption_script import NOTICE_S, Preemption, describe, max_survivable

# The demo's job contract (the runtime's JobConfig fields): gpt-nano (4 blocks, width 128, context
# 128, byte vocabulary) learning the Python standard library's source, validated every 25 steps;
# every blocking call bounded by 2 s (a dead peer is found fast).
CONFIG = {"model": dict(MODEL_PRESETS["gpt-nano"]), "global_batch": 16, "lr": 6e-3, "op_timeout_s": 2.0,
          "schedule": "fiw", "data": {"source": corpus_source()}, "val_every": 25}
MICROBATCHES_PER_STEP = 4
# Steps per second of the demo job on this kind of machine (2 cores), measured by `spotpipe demo`
# itself (see docs/demo.md): turns --duration into the job's steps.
STEPS_PER_SECOND = 4.0
MIN_STEPS = 60
# Preemptions due after this fraction of the job are dropped (the job would be done first).
LATEST_FRACTION = 0.97

EVENT_LABELS = {
    "submitted": "submitted",
    "acquisition": "acquiring",
    "acquired": "nodes launched",
    "generation": "new generation",
    "instance_interruption": "NOTICE",
    "instance_notice": "NOTICE",
    "instance_lost": "NODE LOST",
    "job_provisioning": "provisioning",
    "job_running": "running",
    "job_recovering": "recovering",
    "job_finished": "FINISHED",
    "job_failed": "FAILED",
    "released": "released",
    "agent_worker_exit": "worker exited",
}
# Agent chatter the timeline does not need (the driver reports joins itself).
QUIET_EVENTS = frozenset({"agent_generation_applied"})


def layout_for(nodes: int) -> tuple[int, int]:
    """(dp, pp) of the demo's job for `nodes` nodes: two-stage pipelines when the count allows two
    of them, else data parallelism only. A fixed layout, not the planner's: the planner plans over
    cloud instance types with measured profiles, and a local CPU process has none."""
    if nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {nodes}")
    pp = 2 if nodes >= 4 and nodes % 2 == 0 else 1
    return nodes // pp, pp


def steps_for(duration_s: float) -> int:
    return max(MIN_STEPS, int(duration_s * STEPS_PER_SECOND))


# What a new generation did, from the decision named in its reason (each strategy's `decision`).
GENERATION_LABELS = (("reroute", "WORK RE-ROUTED"), ("takeover", "TAKEN OVER"), ("reinstantiate", "RE-PLANNED"),
                     ("restart", "RESTART"), ("grow", "GREW BACK"))


def event_label(kind: str, message: str) -> str:
    """A short label for a timeline line: what happened, in the words the demo explains."""
    if kind == "generation":
        for word, label in GENERATION_LABELS:
            if f"{word})" in message or f": {word}" in message:
                return label
    return EVENT_LABELS.get(kind, kind)


@transaction.atomic
def submit_job(*, team: Any, user: Any, strategy: str, nodes: int, steps: int, seed: int,
               checkpoint_dir: Path, config: dict[str, Any] | None = None) -> TrainingJob:
    """Submit the demo's GPT job through the API's service, with an explicit plan (dp x pp on the
    local provider) and a checkpoint directory of its own. `config`: another contract than the demo's
    GPT (the chaos soak's MLP)."""
    dp, pp = layout_for(nodes)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    config = {**(config or CONFIG), "seed": seed,
              "checkpoint_dir": tempfile.mkdtemp(prefix="job-", dir=checkpoint_dir), "checkpoint_interval": 10}
    return job_submit(team=team, user=user, name=f"demo gpt {dp}x{pp} {strategy} seed {seed}", config=config,
                      strategy=strategy, target_steps=steps, deadline=timezone.now() + timedelta(hours=1),
                      plan={"dp": dp, "pp": pp, "microbatches": max(1, MICROBATCHES_PER_STEP // dp), "nodes": nodes,
                            "provider": "local"})


@dataclass
class Fired:
    """What the driver did for one scheduled preemption."""

    preemption: Preemption
    at_step: int
    instances: list[int]
    provider_ids: list[str]
    skipped: str = ""


class Console:
    """Progress bar and timeline on a terminal (redrawn in place) or in a log (a line now and then)."""

    def __init__(self, out: TextIO = sys.stdout, *, started: float | None = None) -> None:
        self.out = out
        self.tty = out.isatty()
        self.started = started if started is not None else time.monotonic()
        self.bar_shown = False
        self.last_plain = 0.0

    def clock(self) -> str:
        return describe(time.monotonic() - self.started).rjust(7)

    def line(self, text: str) -> None:
        if self.tty and self.bar_shown:
            self.out.write("\r\x1b[2K")
            self.bar_shown = False
        self.out.write(f"[{self.clock()}] {text}\n")
        self.out.flush()

    def progress(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + text)
            self.bar_shown = True
            self.out.flush()
        elif time.monotonic() - self.last_plain >= 5.0:
            self.last_plain = time.monotonic()
            self.line(text)

    def end_progress(self) -> None:
        if self.tty and self.bar_shown:
            self.out.write("\n")
            self.bar_shown = False
            self.out.flush()


def progress_text(job: TrainingJob, *, width: int = 28) -> str:
    done = min(job.steps_done, job.target_steps)
    filled = int(width * done / job.target_steps) if job.target_steps else 0
    sample = MetricSample.objects.filter(job=job, samples_per_s__isnull=False).order_by("-id").first()
    rate = f"{sample.samples_per_s:7.1f} samples/s" if sample else "      - samples/s"
    loss = f"loss {job.last_loss:.3f}" if job.last_loss is not None else "loss   -  "
    if job.initial_loss is not None and job.last_loss is not None:
        loss += f" (from {job.initial_loss:.3f})"
    running = Instance.objects.filter(job=job, state=InstanceState.RUNNING).count()
    return (f"[{'#' * filled}{'.' * (width - filled)}] step {done}/{job.target_steps}  {loss}  {rate}  "
            f"gen {job.current_generation}  nodes {running}  {job.status}")


@dataclass
class Driver:
    """One job under one preemption schedule."""

    job: TrainingJob
    schedule: list[Preemption]
    provider: LocalProvider
    console: Console
    dp: int
    pp: int
    fired: list[Fired] = field(default_factory=list)
    last_event_id: int = 0
    last_fire: float = 0.0
    training: set[int] = field(default_factory=set)
    ever_trained: set[int] = field(default_factory=set)
    joined: list[int] = field(default_factory=list)

    def _members(self) -> dict[tuple[int, int], Instance]:
        """(pipeline, stage) -> running instance of the current generation."""
        generation = JobGeneration.objects.filter(job=self.job, number=self.job.current_generation).first()
        if generation is None:
            return {}
        ids = {m["instance"]: (m["pipeline"], m["stage"]) for m in generation.membership}
        running = Instance.objects.filter(pk__in=ids, state=InstanceState.RUNNING)
        return {ids[i.pk]: i for i in running}

    def _training(self) -> set[int]:
        """Members of the current generation that have reported a step since it was published: the
        runtime really has them (a replacement is a member for the control plane as soon as it
        enrolls, but trains only once its worker has started and joined)."""
        generation = JobGeneration.objects.filter(job=self.job, number=self.job.current_generation).first()
        if generation is None:
            return set()
        ids = [m["instance"] for m in generation.membership]
        return set(MetricSample.objects.filter(job=self.job, instance_id__in=ids, at__gt=generation.created_at)
                   .values_list("instance_id", flat=True).distinct())

    def _ready(self, preemption: Preemption) -> bool:
        """Fire only on a healthy job: every slot filled by a node that trains. Preempting a job
        whose replacement has not joined the runtime yet can leave a stage with no live copy."""
        job = self.job
        if job.status != JobStatus.RUNNING or job.steps_done < preemption.at_fraction * job.target_steps:
            return False
        members = self._members()
        return len(members) == self.dp * self.pp and {i.pk for i in members.values()} <= self.training

    def _fire(self, preemption: Preemption) -> Fired:
        members = self._members()
        wanted = min(preemption.count, max_survivable(dp=self.dp, pp=self.pp))
        per_stage: dict[int, int] = {}
        victims: list[Instance] = []
        for position in preemption.victims:
            if len(victims) >= wanted:
                break
            instance = members.get(position)
            alive_in_stage = sum(1 for (_p, s) in members if s == position[1])
            # With data parallelism, a stage keeps one live copy (the job goes on without waiting).
            empties_stage = self.dp > 1 and per_stage.get(position[1], 0) >= alive_in_stage - 1
            if instance is None or empties_stage:
                continue
            per_stage[position[1]] = per_stage.get(position[1], 0) + 1
            victims.append(instance)
        if not victims and members:
            victims = [members[sorted(members)[0]]]
        how = f"with a {NOTICE_S:g} s notice" if preemption.with_notice else "without notice (killed)"
        took = "" if len(victims) == preemption.count else f" (the trace took {preemption.count}; "\
            f"{len(victims)} can go without stopping the job)"
        self.console.line(
            f">> preempting {len(victims)} node(s) {how}: trace event {preemption.index + 1} at "
            f"t={describe(preemption.trace_t_s)}{took}: "
            + ", ".join(f"instance {i.pk} ({i.provider_instance_id})" for i in victims))
        fired = Fired(preemption=preemption, at_step=self.job.steps_done, instances=[i.pk for i in victims],
                      provider_ids=[i.provider_instance_id for i in victims])
        for instance in victims:
            try:
                if preemption.with_notice:
                    self.provider.preempt(instance.provider_instance_id, notice_s=NOTICE_S)
                else:
                    self.provider.kill(instance.provider_instance_id)
            except (ProviderError, OSError) as exc:
                self.console.line(f"   could not preempt {instance.provider_instance_id}: {exc}")
        self.last_fire = time.monotonic()
        return fired

    def print_new_events(self) -> None:
        for event in JobEvent.objects.filter(job=self.job, pk__gt=self.last_event_id).order_by("pk"):
            self.last_event_id = event.pk
            if event.kind in QUIET_EVENTS:
                continue
            self.console.line(f"{event_label(event.kind, event.message):>14}: {event.message}")

    def print_joins(self) -> None:
        """A node that trains for the first time after the start is a replacement that joined."""
        self.training = self._training()
        first = JobGeneration.objects.filter(job=self.job, number=1).first()
        initial = {m["instance"] for m in first.membership} if first else set()
        for pk in sorted(self.training - self.ever_trained):
            if pk not in initial:
                self.joined.append(pk)
                self.console.line(f"{'JOINED':>14}: instance {pk} trains (generation {self.job.current_generation}, "
                                  f"step {self.job.steps_done})")
            self.ever_trained.add(pk)

    def run(self, *, timeout_s: float, on_tick=None) -> TrainingJob:
        """Drive until the job ends (or `timeout_s`), then until its nodes are released."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.schedule)
        while time.monotonic() < deadline:
            self.job.refresh_from_db()
            self.print_new_events()
            self.print_joins()
            if pending and self.job.steps_done >= LATEST_FRACTION * self.job.target_steps:
                for preemption in pending:
                    self.console.line(f">> trace event {preemption.index + 1} dropped: the job is nearly done "
                                      "(it waited for the previous replacement to train)")
                    self.fired.append(Fired(preemption=preemption, at_step=self.job.steps_done, instances=[],
                                            provider_ids=[], skipped="the job was nearly done"))
                pending = []
            if pending and self._ready(pending[0]):
                self.fired.append(self._fire(pending.pop(0)))
            if self.job.status not in ACTIVE_JOB_STATUSES:
                break
            self.console.progress(progress_text(self.job))
            if on_tick is not None:
                on_tick()
            time.sleep(0.25)
        self.console.progress(progress_text(self.job))
        self.console.end_progress()
        release_deadline = time.monotonic() + 30
        while time.monotonic() < release_deadline and Instance.objects.filter(
                job=self.job, state__in=(InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING,
                                         InstanceState.NOTICE)).exists():
            self.print_new_events()
            time.sleep(0.25)
        self.print_new_events()
        self.job.refresh_from_db()
        return self.job

    def reconfigurations(self) -> list[Reconfiguration]:
        return list(Reconfiguration.objects.filter(job=self.job).order_by("decided_at", "id"))
