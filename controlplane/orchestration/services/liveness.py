"""Death detection: nodes whose heartbeats stopped, or that never enrolled, are lost."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from controlplane.common.errors import Conflict
from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance, Lifecycle
from controlplane.fleet.states import TERMINAL_STATES, InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobEvent, Reconfiguration, ReconfigurationTrigger
from controlplane.jobs.reconfiguration import (
    current_generations,
    reconfiguration_decide,
    reconfiguration_draft,
    reconfigurations_create,
)
from controlplane.jobs.services import job_record_event
from controlplane.orchestration.providers import get_provider
from controlplane.orchestration.services.generations import (
    reconfiguration_apply,
    reconfigurations_apply,
    reconfigurations_apply_after_commit,
)
from controlplane.orchestration.services.transitions import _end_locked_many, _now, _transition
from controlplane.tunables import tunable

logger = logging.getLogger(__name__)

# A node that never enrolled this long after launch is given up.
ENROLL_TIMEOUT = timedelta(seconds=180)


def heartbeat_timeout_s() -> float:
    """Seconds without a heartbeat after which a node is declared dead."""
    return tunable("SPOTPIPE_HEARTBEAT_TIMEOUT_S")


TERMINATE_GRACE = timedelta(minutes=2)
"""How long a terminate of ours explains a node's silence (the provider call takes seconds)."""


def _terminating(instance: Instance) -> bool:
    stamp = instance.terminate_requested_at
    return stamp is not None and _now() - stamp < TERMINATE_GRACE


def instance_mark_lost(*, instance: Instance, reason: str, notice_id: int | None = None) -> Reconfiguration | None:
    """A node is gone (heartbeat timeout, the provider says it ended): mark it preempted (spot) or
    failed, and decide the job's reconfiguration (once per leaving node). Not a node our own
    terminate is ending (`instance_terminate` records that end)."""
    instance.refresh_from_db(fields=["terminate_requested_at"])
    if _terminating(instance):
        return None
    with transaction.atomic():
        moved = _transition(instance, _lost_state(instance), detail={"reason": reason})
        if not moved or instance.job_id is None:
            return None
        job_record_event(
            job=instance.job,
            kind="instance_lost",
            message=_lost_message(instance, reason),
            data={"instance": instance.pk, "reason": reason},
        )
        reconfiguration = reconfiguration_decide(
            job=instance.job,
            trigger=ReconfigurationTrigger.DEATH,
            trigger_key=f"leave:instance:{instance.pk}",
            instance=instance,
        )
        reconfigurations_apply_after_commit(reconfigurations=[reconfiguration])
    return reconfiguration


def _lost_state(instance: Instance) -> str:
    """Where a lost node goes: a spot node was preempted, any other failed."""
    return InstanceState.PREEMPTED if instance.lifecycle == Lifecycle.SPOT else InstanceState.FAILED


def _lost_message(instance: Instance, reason: str) -> str:
    return f"instance {instance.pk} ({instance.provider_instance_id}) lost: {reason}"[:300]


def instances_mark_lost(*, instances: list[Instance], reason: str) -> list[Reconfiguration]:
    """`instance_mark_lost` for many nodes found gone together (a zone that went silent, a provider
    that reports many ended), then their jobs' reactions applied together: one new generation per
    job, not one per node. A fixed number of statements however many nodes (as a notice batch):
    16 silent nodes of a 256-node job published 16 generations in 0.95 s one by one
    (`python -m bench joblocks`). Returns the reconfigurations it decided (a node another caller
    already marked is left alone)."""
    if not instances:
        return []
    with transaction.atomic():
        jobs, locked = lock_jobs_then_instances(instances=Instance.objects.filter(pk__in=[i.pk for i in instances]))
        locked = [i for i in locked if not _terminating(i)]  # ended by our terminate, which records it
        moved: list[Instance] = []
        for target in (InstanceState.PREEMPTED, InstanceState.FAILED):
            moved += _end_locked_many([i for i in locked if _lost_state(i) == target], target,
                                      detail={"reason": reason})
        leaving = [i for i in moved if i.job_id is not None]
        at = _now()
        JobEvent.objects.bulk_create([
            JobEvent(job=jobs[i.job_id], kind="instance_lost", message=_lost_message(i, reason),
                     data={"instance": i.pk, "reason": reason}, at=at)
            for i in leaving
        ])
        generations = current_generations(jobs=[jobs[i.job_id] for i in leaving])
        decided = reconfigurations_create(drafts=[
            reconfiguration_draft(job=jobs[i.job_id], trigger=ReconfigurationTrigger.DEATH,
                                  trigger_key=f"leave:instance:{i.pk}", instance=i,
                                  generation=generations.get(i.job_id))
            for i in leaving
        ])
    if decided:
        try:
            reconfigurations_apply(reconfigurations=decided)
        except Exception:  # the reconciler applies decided reconfigurations nobody applied
            logger.exception("applying %d reconfigurations for lost nodes together failed", len(decided))
    return decided


def instance_terminate(*, instance: Instance, reason: str) -> Reconfiguration | None:
    """An operator ends a node: its provider is asked to terminate it, the row moves to
    terminated (billing closed, agent token revoked) and, when it served a job that is still
    active, the job reacts as to any leave (a reconfiguration decided, then applied here; the
    reconciler applies it later if applying fails now). An instance already ended is a Conflict;
    a provider that refuses raises ProviderError and nothing is written."""
    instance.refresh_from_db(fields=["state"])
    if instance.state in TERMINAL_STATES:
        raise Conflict(f"instance {instance.pk} is already {instance.state}", field="state")
    # Stamped first: while the provider ends the node, its heartbeats stop and the provider reports
    # it gone; the dead-node check and the reconcile must not take that silence for a preemption.
    Instance.objects.filter(pk=instance.pk).update(terminate_requested_at=_now())
    if instance.provider_instance_id:
        try:
            get_provider(instance.provider).terminate([instance.provider_instance_id])
        except Exception:
            Instance.objects.filter(pk=instance.pk).update(terminate_requested_at=None)
            raise
    reconfiguration = None
    with transaction.atomic():
        if not _transition(instance, InstanceState.TERMINATED, detail={"reason": reason}):
            raise Conflict(f"instance {instance.pk} ended meanwhile ({instance.state})", field="state")
        job = instance.job if instance.job_id is not None else None
        if job is not None and job.status in ACTIVE_JOB_STATUSES:
            message = f"instance {instance.pk} ({instance.provider_instance_id}) terminated: {reason}"
            job_record_event(job=job, kind="instance_terminated", message=message[:300],
                             data={"instance": instance.pk, "reason": reason})
            reconfiguration = reconfiguration_decide(
                job=job, trigger=ReconfigurationTrigger.DEATH, trigger_key=f"leave:instance:{instance.pk}",
                instance=instance,
            )
    if reconfiguration is not None:
        try:
            reconfiguration_apply(reconfiguration=reconfiguration)
        except Exception:  # the reconciler applies decided reconfigurations nobody applied
            logger.exception("applying reconfiguration %s after terminating instance %s", reconfiguration.pk,
                             instance.pk)
    return reconfiguration


def instances_detect_dead(*, timeout_s: float | None = None, now: datetime | None = None) -> list[int]:
    """Running nodes whose last heartbeat is older than the timeout, and pending nodes that never
    enrolled: mark them lost and react. Returns the instance ids."""
    now = now or _now()
    cutoff = now - timedelta(seconds=timeout_s if timeout_s is not None else heartbeat_timeout_s())
    dead = list(
        Instance.objects.select_related("job").filter(
            state__in=(InstanceState.RUNNING, InstanceState.NOTICE), last_heartbeat_at__lt=cutoff
        ).filter(Q(terminate_requested_at__isnull=True) | Q(terminate_requested_at__lt=now - TERMINATE_GRACE))
    )
    stuck = list(
        Instance.objects.select_related("job").filter(
            state__in=(InstanceState.REQUESTED, InstanceState.PENDING), created_at__lt=now - ENROLL_TIMEOUT
        )
    )
    lost = [instance.pk for instance in dead]
    instances_mark_lost(instances=dead, reason="heartbeat timeout")
    if stuck:
        with transaction.atomic():
            _jobs, locked = lock_jobs_then_instances(instances=Instance.objects.filter(pk__in=[i.pk for i in stuck]))
            lost += [i.pk for i in _end_locked_many(locked, InstanceState.FAILED, detail={"reason": "never enrolled"})]
    return lost
