"""Reacting to one notice: move its instance, record the event on the job's timeline, and decide
a reconfiguration. A notice always reacts inside a batch (one notice is a batch of one): the
batch's instances are locked and loaded first, and the rows are collected for the caller's bulk
writes (`processing.notices_process_batch`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from controlplane.fleet.models import Instance, InstanceEvent, InterruptionNotice, Lifecycle, NoticeKind
from controlplane.fleet.services import instance_transition_locked
from controlplane.fleet.states import ALLOWED_TRANSITIONS, InstanceState
from controlplane.jobs.models import JobEvent, JobGeneration, Reconfiguration, ReconfigurationTrigger
from controlplane.jobs.reconfiguration import reconfiguration_draft

# State a notice's kind moves a running instance to (state-change events decide per state).
_LEAVING_EC2_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})


def instance_keys(notice: InterruptionNotice) -> list[str]:
    keys = [notice.provider_instance_id]
    name = (notice.payload or {}).get("meta", {}).get("instance_name")
    if name:
        keys.append(name)
    return keys


def _target_state(notice: InterruptionNotice, instance: Instance) -> str | None:
    if notice.kind == NoticeKind.INTERRUPTION:
        return InstanceState.NOTICE
    if notice.kind == NoticeKind.PREEMPTED:
        return InstanceState.PREEMPTED
    if notice.kind == NoticeKind.STATE_CHANGE and notice.action in _LEAVING_EC2_STATES:
        return InstanceState.PREEMPTED if instance.lifecycle == Lifecycle.SPOT else InstanceState.TERMINATED
    return None


def _describe(notice: InterruptionNotice) -> str:
    label = dict(NoticeKind.choices).get(notice.kind, notice.kind)
    text = f"{label} for {notice.provider_instance_id} via {notice.source}"
    if notice.action:
        text += f" ({notice.action})"
    if notice.deadline:
        text += f", expected to go at {notice.deadline.isoformat()}"
    return text[:300]


# Instances of a batch, locked and loaded once, by provider instance id (a list: two providers, or
# two teams, may use the same id).
InstanceMap = dict[str, list[Instance]]


def _find_instance(notice: InterruptionNotice, known: InstanceMap) -> Instance | None:
    """The notice's instance among those the batch loaded (of the notice's team when it has one):
    absent means unknown."""
    found = [
        instance
        for key in instance_keys(notice)
        for instance in known.get(key, ())
        if notice.team_id is None or instance.team_id == notice.team_id
    ]
    return min(found, key=lambda i: i.pk) if found else None


def _transition_detail(notice: InterruptionNotice) -> dict:
    # The event is stamped when we learn of it, so the instance's log stays in order; the cloud's
    # own time is in the detail.
    return {
        "notice": notice.pk,
        "source": notice.source,
        "kind": notice.kind,
        "action": notice.action,
        "event_time": notice.event_time.isoformat() if notice.event_time else None,
    }


@dataclass(slots=True)
class ReactionBatch:
    """What a batch collects for its bulk writes: the instances it locked and loaded (`known`),
    the rows to insert, the instances it moved, and the reconfigurations it decided."""

    known: InstanceMap
    now: datetime
    job_events: list[JobEvent] = field(default_factory=list)
    instance_events: list[InstanceEvent] = field(default_factory=list)
    moved: dict[int, Instance] = field(default_factory=dict)
    # The current generation of each of the batch's jobs that has one (read once for the batch),
    # the reconfigurations to record (one per leaving node: the first notice of a node wins) and
    # their keys.
    generations: dict[int, JobGeneration] = field(default_factory=dict)
    drafts: list[Reconfiguration] = field(default_factory=list)
    decided: set[tuple[int, str]] = field(default_factory=set)


def react(notice: InterruptionNotice, batch: ReactionBatch) -> None:
    """Move the instance, record the event on the job's timeline, and ask for a reconfiguration.
    The batch locked and loaded the instances, so each is current: it is moved in memory and the
    rows are written in bulk by the caller."""
    instance = _find_instance(notice, batch.known)
    if instance is None:
        # Kept and flagged: an instance we do not know yet (or another team's) is worth seeing.
        notice.unknown_instance = True
        return
    notice.instance = instance
    if notice.team_id is None:
        notice.team_id = instance.team_id
    target = _target_state(notice, instance)
    transitioned = False
    if target and instance.state != target and target in ALLOWED_TRANSITIONS[instance.state]:
        batch.instance_events.append(
            instance_transition_locked(instance=instance, to=target, at=batch.now, detail=_transition_detail(notice))
        )
        batch.moved[instance.pk] = instance
        transitioned = True
    job = instance.job
    if job is None:
        return
    batch.job_events.append(
        JobEvent(
            job=job,
            kind=f"instance_{notice.kind}",
            message=_describe(notice),
            data={
                "notice": notice.pk,
                "instance": instance.pk,
                "source": notice.source,
                "kind": notice.kind,
                "action": notice.action,
                "deadline": notice.deadline.isoformat() if notice.deadline else None,
                "instance_state": instance.state,
                "transitioned": transitioned,
            },
            at=timezone.now(),
        )
    )
    if target is None:
        return
    # One reconfiguration per leaving node, whichever notice (warning, state change) comes first.
    trigger_key = f"leave:instance:{instance.pk}"
    if (job.pk, trigger_key) in batch.decided:
        return  # this batch already decided it
    batch.decided.add((job.pk, trigger_key))
    # The decision input is taken now; the batch inserts the drafts together (and skips keys
    # decided before the batch), with one statement.
    known_generation = job.pk in batch.generations or not job.current_generation
    extra = {"generation": batch.generations.get(job.pk)} if known_generation else {}
    batch.drafts.append(
        reconfiguration_draft(
            job=job,
            trigger=ReconfigurationTrigger.NOTICE,
            trigger_key=trigger_key,
            instance=instance,
            notice=notice,
            **extra,
        )
    )
