"""Reconcile and release: repair the difference between a job's desired and actual capacity,
release an ended job's nodes, and list the jobs the periodic reconcile visits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance
from controlplane.fleet.states import LIVE_STATES, InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobStatus, Reconfiguration, TrainingJob
from controlplane.jobs.services import job_record_event
from controlplane.orchestration import reactions
from controlplane.orchestration.models import Acquisition, AcquisitionReason, AcquisitionStatus
from controlplane.orchestration.providers import get_provider
from controlplane.orchestration.selectors import COUNTED_STATES, job_counted_count, job_counted_instances
from controlplane.orchestration.services.acquisition import acquisition_launch, capacity_request
from controlplane.orchestration.services.capacity_policy import job_capacity_review, other_capacity_retire
from controlplane.orchestration.services.generations import (
    _current_slots,
    job_grow,
    reconfiguration_apply,
    reconfigurations_pending,
)
from controlplane.orchestration.services.job_end import job_fail_if_stalled, job_finish
from controlplane.orchestration.services.job_stop import job_stop_progress
from controlplane.orchestration.services.limits import job_limits_review
from controlplane.orchestration.services.liveness import instances_mark_lost
from controlplane.orchestration.services.region_move import job_region_review
from controlplane.orchestration.services.standby import standby_review
from controlplane.orchestration.services.transitions import _end_locked_many, _transition
from controlplane.planning.plans import JobPlan

logger = logging.getLogger(__name__)


def capacity_release(*, job: TrainingJob) -> list[int]:
    """Terminate every live node of the job (finished, failed or cancelled) and close their billing."""
    instances = list(Instance.objects.filter(job=job, state__in=LIVE_STATES))
    by_provider: dict[str, list[Instance]] = {}
    for instance in instances:
        by_provider.setdefault(instance.provider, []).append(instance)
    for provider_kind, group in by_provider.items():
        ids = [i.provider_instance_id for i in group if i.provider_instance_id]
        if ids:
            get_provider(provider_kind).terminate(ids)
    # The nodes' ends and the timeline's "released" event commit together: no reader (the API, the
    # dashboard, a test) sees the nodes gone without the event, and a crash in between leaves the
    # nodes live for the next reconcile to release, event and all.
    from controlplane.orchestration.rendezvous import rendezvous_retire, rendezvous_stop

    with transaction.atomic():
        jobs, locked = lock_jobs_then_instances(
            job_ids=[job.pk], instances=Instance.objects.filter(pk__in=[i.pk for i in instances]))
        released = [i.pk for i in _end_locked_many(locked, InstanceState.TERMINATED,
                                                   detail={"reason": f"job {job.status}"})]
        if released:
            job_record_event(
                job=job, kind="released", message=f"released {len(released)} node(s)", data={"instances": released}
            )
        # A resume can come as soon as the nodes are gone, and its launch may already have been handed
        # this store: retired only while the job is still over, under its lock (a resume takes it
        # too), so a later resume starts a new store and an earlier one keeps this one.
        over = job.pk in jobs and jobs[job.pk].status not in ACTIVE_JOB_STATUSES
        retired = rendezvous_retire(job=job) if over else None
    if retired is not None:
        rendezvous_stop(retired)
    return released


def capacity_reconcile(*, job: TrainingJob) -> dict[str, Any]:
    """Compare desired and actual capacity of one job and repair the difference:
    - a finished/cancelled/failed job has all its nodes released (a job with no progress for
      SPOTPIPE_JOB_STALL_TIMEOUT_S is failed first);
    - nodes the provider reports gone are marked lost (and the job reacts);
    - decided reconfigurations nobody applied are applied;
    - missing capacity is requested (cheapest pool that fits, avoiding pools that just preempted us)
      and launched; surplus nodes that are not members are terminated.
    Idempotent: run it as often as you like."""
    job.refresh_from_db()
    report: dict[str, Any] = {"job": job.pk, "lost": [], "requested": 0, "launched": 0, "released": [], "surplus": []}
    if job_finish(job=job) or job_fail_if_stalled(job=job):
        job.refresh_from_db()
    report["stopping"] = _review("limits", job_limits_review, job)
    if job_stop_progress(job=job):
        job.refresh_from_db()
    if job.status not in ACTIVE_JOB_STATUSES:
        report["released"] = capacity_release(job=job)
        return report
    # Drift: ask the provider about the nodes we believe alive.
    live = [
        i
        for i in Instance.objects.filter(
            job=job, state__in=(InstanceState.PENDING, InstanceState.RUNNING, InstanceState.NOTICE)
        ).only("id", "provider", "provider_instance_id")  # all it needs: a 1,024-node job's full rows cost ~70 ms
        if i.provider_instance_id
    ]
    by_provider: dict[str, list[Instance]] = {}
    for instance in live:
        by_provider.setdefault(instance.provider, []).append(instance)
    for provider_kind, group in by_provider.items():
        states = {
            n.provider_instance_id: n.state
            for n in get_provider(provider_kind).describe([i.provider_instance_id for i in group])
        }
        gone = [i for i in group if states.get(i.provider_instance_id) in ("terminated", "missing", "stopping")]
        instances_mark_lost(instances=gone, reason="provider reports it gone")  # one reaction for all of them
        report["lost"] += [i.pk for i in gone]
    if job.status == JobStatus.STOPPING:
        return report  # it writes its checkpoint on what it holds: nothing is bought for it
    for pk in reconfigurations_pending(job=job):
        reconfiguration_apply(reconfiguration=Reconfiguration.objects.get(pk=pk))
    job.refresh_from_db()
    choice = _review("capacity", job_capacity_review, job)
    report["capacity"] = choice.capacity_type if choice is not None else None
    report["moved_to"] = _review("region", job_region_review, job)
    reason = AcquisitionReason.REPLACEMENT if job.current_generation else AcquisitionReason.INITIAL
    acquisition = capacity_request(job=job, reason=reason)
    if acquisition is not None:
        report["requested"] = acquisition.count
    for pending in Acquisition.objects.filter(
        job=job, status__in=(AcquisitionStatus.REQUESTED, AcquisitionStatus.LAUNCHING)
    ):
        report["launched"] += len(acquisition_launch(acquisition=pending))
    job_grow(job=job)
    report["standby_released"] = _review("standby", standby_review, job, default=[])
    report["retired"] = other_capacity_retire(job=job)
    report["surplus"] = _terminate_surplus(job)
    return report


def _review(name: str, review: Callable[..., Any], job: TrainingJob, *, default: Any = None) -> Any:
    """One of the reconcile's reviews of `job` (limits, region, capacity policy, standby): what it
    returns, or `default` when it raised (logged: a failing review must not stop the reconcile
    from repairing capacity). The job is read again when it changed something."""
    try:
        result = review(job=job)
    except Exception:
        logger.exception("job %s: %s review failed", job.pk, name)
        return default
    if result:
        job.refresh_from_db()
    return result


def _terminate_surplus(job: TrainingJob) -> list[int]:
    """Nodes beyond the plan that are not members of the current generation (a replacement that
    arrived after the job already grew back, say)."""
    plan = JobPlan.from_dict(job.plan)
    if job_counted_count(job=job) <= plan.nodes:  # the usual answer, without loading every node
        return []
    if job_counted_count(job=job, lifecycle=job.capacity_type) < job_counted_count(job=job):
        return []  # a capacity switch in progress: its spares are the swap's (`other_capacity_retire`)
    counted = job_counted_instances(job=job)
    extra = len(counted) - plan.nodes
    if extra <= 0:
        return []
    members = set(reactions.alive(_current_slots(job) or []))
    spare = [i for i in reversed(counted) if i.pk not in members and i.state == InstanceState.RUNNING][:extra]
    ids = [i.provider_instance_id for i in spare if i.provider_instance_id]
    if ids:
        get_provider(plan.provider).terminate(ids)
    for instance in spare:
        with transaction.atomic():
            _transition(instance, InstanceState.TERMINATED, detail={"reason": "surplus"})
    return [i.pk for i in spare]


def active_job_ids() -> list[int]:
    """Jobs that hold or want capacity (and ended jobs that still hold some)."""
    ids = {
        pk
        for pk, status, plan in TrainingJob.objects.filter(status__in=ACTIVE_JOB_STATUSES).values_list(
            "pk", "status", "plan"
        )
        if status != JobStatus.PENDING or plan
    }
    ids |= set(
        Instance.objects.filter(state__in=COUNTED_STATES | {InstanceState.NOTICE}, job__isnull=False).values_list(
            "job_id", flat=True
        )
    )
    return sorted(ids)
