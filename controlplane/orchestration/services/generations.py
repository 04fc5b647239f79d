"""Generations and reactions: publish a job's next generation when nodes join (grow) or leave
(apply the decided reconfigurations with the strategy's reaction), and when a decided leave is
applied.

When: whoever decides a leave (the notice processor in `orchestration.notices`, `liveness` for a
node that stopped) calls `reconfigurations_apply_after_commit` inside its transaction, and the next
generation is published once the decision has committed. In a Celery worker (the notice drain) it
is applied inline: one broker hop less between a notice and the agents' new generation. From
anywhere else it is handed to the `apply_reconfiguration` task. Applying is idempotent (a
reconfiguration moves from decided to applied under the job lock), so the reconciler's later pass
over decided rows never applies one twice."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance
from controlplane.fleet.states import LIVE_STATES, InstanceState
from controlplane.jobs.artifacts import job_latest_checkpoint
from controlplane.jobs.models import (
    ACTIVE_JOB_STATUSES,
    EndReason,
    JobGeneration,
    JobStatus,
    Reconfiguration,
    ReconfigurationStatus,
    ReconfigurationTrigger,
    TrainingJob,
)
from controlplane.jobs.prepare_step import prepare_location
from controlplane.jobs.reconfiguration import current_generations, reconfiguration_decide
from controlplane.jobs.selectors import job_runtime_config
from controlplane.jobs.services import job_generation_publish
from controlplane.orchestration import reactions
from controlplane.orchestration.enqueue import enqueue, enqueue_on_commit
from controlplane.orchestration.selectors import job_current_generation
from controlplane.orchestration.services.job_end import job_fail
from controlplane.orchestration.services.transitions import _job_set_status, _lock_job, _now
from controlplane.planning.plans import JobPlan
from runtime.config import JobConfig
from runtime.distributed.published_layout import PublishedLayout
from runtime.strategies import get_strategy

logger = logging.getLogger(__name__)


def _react_leave(job: TrainingJob, current: reactions.Slots, leaving: set[int],
                 noticed: set[int]) -> reactions.Reaction:
    """The reaction to `leaving`; when it would fail the job because every copy of some layer is
    gone, asked again with the job's newest checkpoint (listed only then: it may be on S3), which
    lets recycle, bamboo and oobleck restart from it as their workers would."""
    config = job_runtime_config(job)
    reaction = reactions.react_leave(config, current, leaving, noticed=noticed)
    if reaction.decision == "fail" and get_strategy(config.strategy).falls_back_to_checkpoint:
        step = job_latest_checkpoint(job=job)
        if step is not None:
            reaction = reactions.react_leave(config, current, leaving, noticed=noticed, checkpoint_step=step)
    return reaction


def _react_without_generation(job: TrainingJob, reaction: reactions.Reaction) -> None:
    """A leave after which the job cannot run now: it waits for replacements (`wait`), or, when its
    state is lost for good (`fail`), it fails with the runtime's reason instead of buying nodes."""
    if reaction.decision == "fail":
        job_fail(job=job, reason=reaction.reason, end_reason=EndReason.NO_CHECKPOINT)
    else:
        _job_set_status(job, JobStatus.RECOVERING, f"waiting for replacements: {reaction.reason}")


def _publish(job: TrainingJob, slots: reactions.Slots, *, decision: str, reason: str,
             config: JobConfig | None = None) -> Any:
    """Publish the next generation for `slots`: membership with runtime node ids, and a layout that
    names the strategy, the holes, the node ids and the rendezvous store the workers meet at."""
    from controlplane.orchestration.rendezvous import rendezvous_address

    config = config or job_runtime_config(job)  # the layout's one home: the job's contract
    previous = job_current_generation(job=job)
    # A start (the first generation, or a resumed job's fresh one) numbers its workers 0..n-1: the
    # runtime takes a node numbered past dp x pp for a replacement joining a running group.
    known = published_layout(previous).node_ids() if previous else {}
    nodes = reactions.assign_nodes(slots, None if decision == "start" else (known or None))
    layout = PublishedLayout(
        strategy=config.strategy, dp=config.dp, pp=config.pp, slots=slots, decision=decision,
        restart_from_checkpoint=decision == "restart", holes=reactions.holes(slots), nodes=sorted(nodes.items()),
        rendezvous=rendezvous_address(job=job),
    )
    generation = job_generation_publish(
        job=job,
        membership=reactions.membership_of(slots, nodes),
        layout=layout.to_dict(),
        reason=reason,
    )
    degraded = bool(reactions.holes(slots))
    status = JobStatus.RECOVERING if degraded else JobStatus.RUNNING
    if job.status in ACTIVE_JOB_STATUSES:
        _job_set_status(
            job,
            status,
            f"generation {generation.number}: {reason}",
            data={"generation": generation.number, "strategy": config.strategy},
        )
    return generation


def published_layout(generation: JobGeneration) -> PublishedLayout:
    """The layout `generation` was published with (`_publish`), typed."""
    return PublishedLayout.from_dict(generation.layout)


def _current_slots(job: TrainingJob) -> reactions.Slots | None:
    generation = job_current_generation(job=job)
    if generation is None:
        return None
    return published_layout(generation).slots


def _any_member_live(job: TrainingJob, slots: reactions.Slots) -> bool:
    members = set(reactions.alive(slots))
    return Instance.objects.filter(job=job, pk__in=members, state__in=LIVE_STATES).exists()


def _running_ids(job: TrainingJob) -> list[int]:
    running = Instance.objects.filter(job=job, state=InstanceState.RUNNING).order_by("id")
    return list(running.values_list("pk", flat=True))


@transaction.atomic
def job_grow(*, job: TrainingJob, instance: Instance | None = None) -> Any:
    """A node joined (enrolled): publish the first generation once the plan's nodes run, or fill
    the job's holes with running nodes that are not yet members."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES or JobPlan.from_dict(locked.plan).awaiting_profile:
        return None  # a job waiting for its first node's profile is planned first (`services.profile`)
    if prepare_location(locked):
        return None  # its nodes prepare its data first (`services.prepare`)
    config = job_runtime_config(locked)
    running = _running_ids(locked)
    slots = _current_slots(locked)
    if slots is not None and not _any_member_live(locked, slots):
        # Every member of the current generation has ended (the job was resumed after its nodes were
        # released): no reaction can grow that generation back, so the nodes that run start afresh,
        # from the checkpoint its resume named, as a first generation does.
        slots = None
    if slots is None:
        if len(running) < config.dp * config.pp:
            return None
        from controlplane.orchestration.rendezvous import rendezvous_address, rendezvous_enabled

        if rendezvous_enabled() and not rendezvous_address(job=locked):
            return None  # the store is still starting; the acquiring task publishes once it is up
        return _publish(
            locked,
            reactions.full_slots(running, dp=config.dp, pp=config.pp),
            decision="start",
            reason="initial membership",
            config=config,
        )
    members = set(reactions.alive(slots))
    joiners = [i for i in running if i not in members]
    if not joiners or not reactions.holes(slots):
        return None
    reaction = reactions.react_join(config, slots, joiners)
    if reaction.slots is None:
        return None
    key = "join:" + ",".join(str(i) for i in joiners[: len(reactions.holes(slots))])
    trigger_instance = instance if instance is not None else Instance.objects.get(pk=joiners[0])
    reconfiguration = reconfiguration_decide(
        job=locked, trigger=ReconfigurationTrigger.JOIN, trigger_key=key, instance=trigger_instance
    )
    if reconfiguration.status != ReconfigurationStatus.DECIDED:
        return None
    # A strategy whose answer to a change is a restart restarts to take joiners in too.
    decision = "restart" if get_strategy(config.strategy).decision == "restart" else "grow"
    generation = _publish(locked, reaction.slots, decision=decision, reason=f"{reaction.reason} ({decision})",
                          config=config)
    _mark_applied(reconfiguration, decision=decision, generation=generation.number)
    return generation


def reconfiguration_lost_seconds(*, reconfiguration: Reconfiguration, applied_at: datetime) -> float:
    """Training time the event cost, as the control plane can see it: the stall from the moment the
    node stopped contributing to the moment the job's next generation was published.

    - a death: from the node's last heartbeat (else the decision) to the new generation;
    - a notice: nothing when the new generation came before the node's deadline (the graceful
      case), else the time past the deadline;
    - a join: nothing.
    The in-flight step a kill makes the survivors redo is not counted (the runtime knows it, the
    control plane does not), so this is a lower bound."""
    if reconfiguration.trigger == ReconfigurationTrigger.JOIN:
        return 0.0
    if reconfiguration.trigger == ReconfigurationTrigger.NOTICE:
        deadline = reconfiguration.notice.deadline if reconfiguration.notice_id else None
        return max(0.0, (applied_at - deadline).total_seconds()) if deadline else 0.0
    instance = reconfiguration.instance
    stopped = (instance.last_heartbeat_at if instance else None) or reconfiguration.decided_at
    return max(0.0, (applied_at - stopped).total_seconds())


_APPLIED_FIELDS = ["decision", "to_generation", "status", "applied_at", "lost_seconds"]


def _set_applied(reconfiguration: Reconfiguration, *, decision: str, generation: int | None) -> None:
    """Mark applied in memory (the caller saves)."""
    reconfiguration.decision = decision
    reconfiguration.to_generation = generation
    reconfiguration.status = ReconfigurationStatus.APPLIED
    reconfiguration.applied_at = _now()
    # Priced by the cost report as work lost to preemptions.
    reconfiguration.lost_seconds = reconfiguration_lost_seconds(
        reconfiguration=reconfiguration, applied_at=reconfiguration.applied_at
    )


def _mark_applied(reconfiguration: Reconfiguration, *, decision: str, generation: int | None) -> None:
    _set_applied(reconfiguration, decision=decision, generation=generation)
    reconfiguration.save(update_fields=_APPLIED_FIELDS)


def reconfiguration_apply(*, reconfiguration: Reconfiguration) -> Any:
    """Act on one decided reconfiguration for a leaving node: a batch of one
    (`reconfigurations_apply`, the one place a leave is reacted to). Returns the generation it
    published, or None (it waited, failed the job, had nothing to change, or was applied already)."""
    return reconfigurations_apply(reconfigurations=[reconfiguration]).get(reconfiguration.pk)


@transaction.atomic
def reconfigurations_apply(*, reconfigurations: list[Reconfiguration]) -> dict[int, Any]:
    """Apply a batch of decided leave reconfigurations (the notice processor's, on commit) in one
    transaction, with the same end state as `reconfiguration_apply` called for each in turn, in
    the order they were decided (id order).

    Applying in turn, each one locks its job, reads the current generation and the job's running
    nodes, and either does nothing (`none`: the job is not active, has no generation yet, or the
    node is no longer a member), waits for replacements, or publishes a generation without every
    member that is not running. Between two of them only the generation and the job's status
    change (nothing here moves an instance), so this reads the jobs (locked, in id order), the
    reconfigurations (locked), the current generations and the running nodes once for the batch,
    replays that sequence in memory, and writes the reconfigurations with one statement. What
    does change a job (a new generation, a status change: one per job and batch in practice, as
    the first publish already leaves out every node that is not running) goes through the same
    `_publish` / `_job_set_status` as `reconfiguration_apply`.

    Returns {reconfiguration id: the generation it published, or None}. Reconfigurations that are
    no longer `decided` (applied by someone else meanwhile) or are joins are left alone."""
    from controlplane.fleet.bulk import bulk_update_by_pk

    # Imported here, not at the top: the tasks module imports these services (its tasks wrap them)
    # and the task enqueued here calls them back, a true import cycle.
    from controlplane.orchestration import tasks

    job_ids = sorted({r.job_id for r in reconfigurations})
    if not job_ids:
        return {}
    # Jobs first (`lock_jobs_then_instances`), then reconfigurations: one order for every applier.
    jobs, _instances = lock_jobs_then_instances(job_ids=job_ids)
    rows = list(
        Reconfiguration.objects.select_for_update(of=("self",))
        .select_related("notice", "instance")
        .filter(pk__in=[r.pk for r in reconfigurations], status=ReconfigurationStatus.DECIDED)
        .exclude(trigger=ReconfigurationTrigger.JOIN)
        .order_by("pk")
    )
    if not rows:
        return {}
    # Slots of each active job's current generation, and its running nodes: read once.
    generations = current_generations(jobs=[job for job in jobs.values() if job.status in ACTIVE_JOB_STATUSES])
    slots = {pk: published_layout(g).slots for pk, g in generations.items()}
    running: dict[int, set[int]] = {pk: set() for pk in slots}
    noticed: set[int] = set()  # still here, leaving: the runtime may keep them until a replacement joins
    if slots:
        for job_id, pk, state in Instance.objects.filter(
            job_id__in=slots, state__in=(InstanceState.RUNNING, InstanceState.NOTICE)
        ).values_list("job_id", "pk", "state"):
            (running[job_id] if state == InstanceState.RUNNING else noticed).add(pk)
    published: dict[int, Any] = {}
    reconcile: list[int] = []
    for reconfiguration in rows:
        job = jobs[reconfiguration.job_id]
        published[reconfiguration.pk] = None
        if job.status not in ACTIVE_JOB_STATUSES:
            _set_applied(reconfiguration, decision="none", generation=None)
            continue
        current = slots.get(job.pk)
        alive = set(reactions.alive(current or []))
        leaving = alive - running.get(job.pk, set())
        if reconfiguration.instance_id:
            leaving.add(reconfiguration.instance_id)
        if current is None or not leaving & alive:
            _set_applied(reconfiguration, decision="none", generation=None)
            continue
        reaction = _react_leave(job, current, leaving, noticed & leaving)
        if job.pk not in reconcile:
            reconcile.append(job.pk)
        if reaction.slots is None:
            _set_applied(reconfiguration, decision=reaction.decision, generation=None)
            _react_without_generation(job, reaction)
            continue
        generation = _publish(
            job,
            reaction.slots,
            decision=reaction.decision,
            reason=f"{reconfiguration.trigger} {sorted(leaving)}: {reaction.decision}",
        )
        slots[job.pk] = published_layout(generation).slots
        _set_applied(reconfiguration, decision=reaction.decision, generation=generation.number)
        published[reconfiguration.pk] = generation
    bulk_update_by_pk(Reconfiguration, rows, _APPLIED_FIELDS)
    # One reconcile per job (applying in turn enqueues one per reconfiguration that waited or
    # published; the task is idempotent, so the extra ones did nothing).
    for pk in reconcile:
        enqueue_on_commit(tasks.reconcile_job, pk)
    return published


def reconfigurations_pending(*, job: TrainingJob | None = None) -> list[int]:
    qs = Reconfiguration.objects.filter(status=ReconfigurationStatus.DECIDED).exclude(
        trigger=ReconfigurationTrigger.JOIN
    )
    if job is not None:
        qs = qs.filter(job=job)
    return list(qs.order_by("decided_at").values_list("pk", flat=True))


def _in_worker() -> bool:
    """Whether this runs inside a Celery task (the notice processor's drain)."""
    from celery import current_task

    return bool(current_task and current_task.request.id)


def _apply_one(reconfiguration_id: int) -> None:
    # Imported here, not at the top: the tasks module imports these services (its tasks wrap them).
    from controlplane.orchestration import tasks

    if _in_worker():
        try:
            reconfiguration = Reconfiguration.objects.select_related("job").get(pk=reconfiguration_id)
            reconfiguration_apply(reconfiguration=reconfiguration)
            return
        except Exception:
            logger.exception("applying reconfiguration %s inline failed; handing it to a task", reconfiguration_id)
    enqueue(tasks.apply_reconfiguration, reconfiguration_id)


def _apply_now(reconfigurations: list[Reconfiguration]) -> None:
    """A batch decided together is applied together in a worker: one transaction and a constant
    number of statements, with the same end state as applying each in turn. If that fails, each
    is applied on its own, so one failing reconfiguration cannot hold back the others."""
    if _in_worker():
        try:
            reconfigurations_apply(reconfigurations=reconfigurations)
            return
        except Exception:
            logger.exception(
                "applying %d reconfigurations together failed; applying them one by one", len(reconfigurations)
            )
    for reconfiguration in reconfigurations:
        _apply_one(reconfiguration.pk)


def reconfigurations_apply_after_commit(*, reconfigurations: list[Reconfiguration]) -> None:
    """Apply the decided leave reconfigurations among `reconfigurations` once the caller's
    transaction commits (at once outside one). Joins are applied by their decider
    (`job_grow`), and rows already applied or skipped are left alone."""
    rows = [
        r
        for r in reconfigurations
        if r.trigger != ReconfigurationTrigger.JOIN and r.status == ReconfigurationStatus.DECIDED
    ]
    if rows:
        transaction.on_commit(lambda: _apply_now(rows))
