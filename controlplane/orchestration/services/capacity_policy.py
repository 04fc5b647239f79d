"""A job's capacity policy at run time: which capacity type its nodes are bought as now
(`spot_then_on_demand` switches by `runtime.planner.capacity_policy.choose_capacity_type`), whether
its deadline has become unreachable (an event and an alert, once), and the rolling swap of nodes of
the type the job no longer wants.

The estimate of the work left is the job's own: its measured step time (the median of its recent
metric samples) or, before any sample, the planner's predicted step time (an explicit plan with a
deadline stores the planner's estimate of its own layout). A job with neither (an explicit plan of a
model function that has not trained yet) is not judged until its first samples arrive.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobStatus, TrainingJob
from controlplane.jobs.selectors import job_measured_step_s
from controlplane.jobs.services import job_record_event
from controlplane.orchestration import reactions
from controlplane.orchestration.selectors import COUNTED_STATES, pools_ranked
from controlplane.orchestration.services.generations import _current_slots
from controlplane.orchestration.services.transitions import _lock_job, _now
from controlplane.tunables import tunable
from runtime.planner.capacity_policy import (
    ON_DEMAND,
    SPOT,
    SPOT_THEN_ON_DEMAND,
    CapacityChoice,
    choose_capacity_type,
    deadline_unreachable,
    planned_spot_rate,
)

logger = logging.getLogger(__name__)

DECISION_PERIOD_S = 3.0
"""How often the reconcile asks again (controlplane/beat.py): the rule keeps this much margin."""


@dataclass(frozen=True, slots=True)
class WorkEstimate:
    """Seconds of work left at full speed and seconds to the deadline, and where the step time came from."""

    step_s: float
    work_left_s: float
    work_total_s: float
    time_left_s: float
    since_start_s: float
    source: str
    """`measured` (the job's metric samples) or `predicted` (the planner's plan)."""


def work_estimate(*, job: TrainingJob, now: datetime) -> WorkEstimate | None:
    """The job's work left and time left, or None without a deadline or a step time to go by."""
    if job.deadline is None:
        return None
    step_s, source = job_measured_step_s(job), "measured"
    if step_s is None:
        predicted = (job.plan or {}).get("predicted") or {}
        step_s, source = predicted.get("step_s"), "predicted"
    if not isinstance(step_s, int | float) or step_s <= 0:
        return None
    left = max(0, job.target_steps - job.steps_done)
    start = job.started_at or job.created_at
    return WorkEstimate(step_s=float(step_s), work_left_s=left * step_s, work_total_s=job.target_steps * step_s,
                        time_left_s=(job.deadline - now).total_seconds(),
                        since_start_s=max(0.0, (now - start).total_seconds()), source=source)


def spot_progress_rate(job: TrainingJob, estimate: WorkEstimate) -> float:
    """The progress spot is expected to make per second of wall time: the job's own (work done per
    second since it started, waits and restarts included) once it has run for a few minutes on spot,
    else the planner's goodput for its plan, else `SPOTPIPE_SPOT_PROGRESS_RATE`."""
    if estimate.since_start_s >= 300 and job.steps_done > 0 and job.capacity_type == SPOT:
        return max(0.01, min(1.0, job.steps_done * estimate.step_s / estimate.since_start_s))
    goodput = ((job.plan or {}).get("predicted") or {}).get("goodput_fraction")
    if isinstance(goodput, int | float) and 0 < goodput <= 1:
        return float(goodput)
    return float(tunable("SPOTPIPE_SPOT_PROGRESS_RATE"))


def _holds(job: TrainingJob, capacity_type: str) -> bool:
    return Instance.objects.filter(job=job, lifecycle=capacity_type, state=InstanceState.RUNNING).exists()


def job_capacity_review(*, job: TrainingJob, now: datetime | None = None) -> CapacityChoice | None:
    """Apply the job's capacity policy now: record an unreachable deadline once (timeline and alert),
    and for `spot_then_on_demand` switch `capacity_type` when the rule says so (a timeline event
    with the rule's reason). Returns the rule's choice, or None when nothing was judged."""
    now = now or _now()
    if job.status not in ACTIVE_JOB_STATUSES:
        return None
    estimate = work_estimate(job=job, now=now)
    if estimate is None:
        return None
    overhead_s = float(tunable("SPOTPIPE_CAPACITY_SWITCH_OVERHEAD_S"))
    on_demand_now = job.capacity_type == ON_DEMAND and _holds(job, ON_DEMAND)
    if job.deadline_unreachable_at is None and deadline_unreachable(
            work_left_s=estimate.work_left_s, time_left_s=estimate.time_left_s,
            overhead_s=0.0 if on_demand_now else overhead_s):
        _record_unreachable(job, estimate, now=now)
    if job.capacity != SPOT_THEN_ON_DEMAND:
        return None
    current = job.capacity_type if _holds(job, job.capacity_type) else None
    spot_available = bool(pools_ranked(job=job, capacity_type=SPOT).usable)
    rate = planned_spot_rate(work_s=estimate.work_total_s,
                             deadline_s=estimate.since_start_s + estimate.time_left_s,
                             spot_progress_rate=spot_progress_rate(job, estimate))
    choice = choose_capacity_type(work_left_s=estimate.work_left_s, time_left_s=estimate.time_left_s,
                                  spot_available=spot_available, current=current, overhead_s=overhead_s,
                                  spot_progress_rate=rate, margin_s=DECISION_PERIOD_S)
    if choice.capacity_type != job.capacity_type:
        _switch(job, choice, estimate)
    return choice


def _record_unreachable(job: TrainingJob, estimate: WorkEstimate, *, now: datetime) -> None:
    from controlplane.webhooks.alerts import alert_deadline_unreachable

    with transaction.atomic():
        locked = _lock_job(job)
        if locked.deadline_unreachable_at is not None:
            return
        locked.deadline_unreachable_at = now
        locked.save(update_fields=["deadline_unreachable_at", "updated_at"])
        message = (f"the deadline is unreachable: {estimate.work_left_s / 3600:.2f} h of work left "
                   f"({estimate.source} step {estimate.step_s:.3f} s) in {estimate.time_left_s / 3600:.2f} h")
        job_record_event(job=locked, kind="deadline_unreachable", message=message, at=now, data={
            "work_left_s": round(estimate.work_left_s, 1), "time_left_s": round(estimate.time_left_s, 1),
            "step_s": estimate.step_s, "step_source": estimate.source})
        alert_deadline_unreachable(job=locked, message=message)
    job.deadline_unreachable_at = now


def _switch(job: TrainingJob, choice: CapacityChoice, estimate: WorkEstimate) -> None:
    with transaction.atomic():
        locked = _lock_job(job)
        if locked.capacity_type == choice.capacity_type or locked.status not in ACTIVE_JOB_STATUSES:
            return
        before = locked.capacity_type
        locked.capacity_type = choice.capacity_type
        locked.save(update_fields=["capacity_type", "updated_at"])
        job_record_event(job=locked, kind="capacity_switch", message=f"{before} -> {choice.capacity_type}: "
                         f"{choice.reason}", data={"from": before, "to": choice.capacity_type,
                                                    "work_left_s": round(estimate.work_left_s, 1),
                                                    "time_left_s": round(estimate.time_left_s, 1)})
    job.capacity_type = choice.capacity_type
    logger.info("job %s: capacity %s -> %s (%s)", job.pk, before, choice.capacity_type, choice.reason)


def other_capacity_retire(*, job: TrainingJob) -> int | None:
    """The rolling swap after a switch: while the job holds running nodes of the type it no longer
    wants and a running spare of the wanted type waits outside the generation, end one old node (the
    job reacts as to any leave, and its next grow takes the spare in). One a call, only while the
    job runs, so each swap is one small reconfiguration. Returns the instance ended, if any."""
    from controlplane.orchestration.services.liveness import instance_terminate

    job.refresh_from_db(fields=["status", "capacity_type", "current_generation"])
    if job.status != JobStatus.RUNNING:
        return None
    if not Instance.objects.filter(job=job, state=InstanceState.RUNNING).exclude(
            lifecycle=job.capacity_type).exists():
        return None  # the usual answer, without loading a 1,024-node job's rows every reconcile
    counted = list(Instance.objects.filter(job=job, state__in=COUNTED_STATES).order_by("id"))
    old = [i for i in counted if i.lifecycle != job.capacity_type and i.state == InstanceState.RUNNING]
    if not old:
        return None
    members = set(reactions.alive(_current_slots(job) or []))
    spares = [i for i in counted if i.lifecycle == job.capacity_type and i.state == InstanceState.RUNNING
              and i.pk not in members]
    if not spares:
        return None
    leaving = next((i for i in old if i.pk in members), old[0])
    instance_terminate(instance=leaving, reason=f"capacity switch to {job.capacity_type}")
    return leaving.pk

