"""The end of a job: failed (its runtime cannot go on, its requirements cannot be installed, it
stalled) or finished (its steps are done and its workers have exited)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from controlplane.fleet.models import Instance
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobEvent, JobStatus, MetricSample, TrainingJob
from controlplane.orchestration.enqueue import enqueue_on_commit
from controlplane.orchestration.selectors import job_current_generation
from controlplane.orchestration.services.transitions import _job_set_status, _lock_job, _now
from controlplane.tunables import tunable

# After the last step, how long to wait for the members' workers to exit on their own (they save
# their final state) before the job is declared finished and its nodes released anyway.
FINISH_GRACE = timedelta(seconds=30)
# Exit code of an agent's worker whose runtime found that the job cannot go on
# (agent.worker_entry.EXIT_JOB_FAILED; the control plane does not import the agent).
WORKER_EXIT_JOB_FAILED = 4

def job_stall_timeout_s() -> float:
    """Seconds a running job may go without progress (a committed step, a new generation) before
    the reconcile loop fails it: the safety net for a runtime that died without saying why."""
    return tunable("SPOTPIPE_JOB_STALL_TIMEOUT_S")


@transaction.atomic
def job_fail(*, job: TrainingJob, reason: str, data: dict | None = None) -> bool:
    """Mark an active job failed with `reason` on its timeline (the status alert goes out with the
    status change) and release its nodes once this commits. Idempotent: False when it had ended."""
    # Imported here, not at the top: the tasks module imports these services (its tasks wrap them)
    # and the task enqueued here calls them back, a true import cycle.
    from controlplane.orchestration import tasks

    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES:
        return False
    _job_set_status(locked, JobStatus.FAILED, reason, data={"reason": reason, **(data or {})})
    enqueue_on_commit(tasks.reconcile_job, locked.pk)
    return True


def worker_exit_report(*, instance: Instance, code: int | None, reason: str, generation: int | None) -> bool:
    """An agent's worker exited. When its runtime said the job cannot go on, the job fails with
    that reason (strategies that restart from a checkpoint do so inside the runtime, so a failure
    that reaches here had no checkpoint to restart from). Returns True when the job was failed."""
    if instance.job is None or code != WORKER_EXIT_JOB_FAILED:
        return False
    return job_fail(
        job=instance.job,
        reason=f"runtime cannot continue: {reason or 'no reason given'}",
        data={"instance": instance.pk, "generation": generation},
    )


def requirements_failed_report(*, instance: Instance, reason: str) -> bool:
    """An agent could not install the job's requirements (`config.requirements`): the job fails
    with pip's last lines. Every node would fail the same way, so no replacement is bought and the
    agent does not retry. Returns True when the job was failed (False: it had ended already)."""
    if instance.job is None:
        return False
    return job_fail(job=instance.job, reason=f"requirements could not be installed: {reason or 'no reason given'}",
                    data={"instance": instance.pk})


def _last_progress(job: TrainingJob) -> datetime | None:
    """When the job last moved: its newest metric sample, generation or line of a node installing its
    requirements (a long pip install is not a stall; None before it ran)."""
    sample = MetricSample.objects.filter(job=job).order_by("-at").values_list("at", flat=True).first()
    generation = job_current_generation(job=job)
    installing = (JobEvent.objects.filter(job=job, kind="agent_requirements_output").order_by("-at")
                  .values_list("at", flat=True).first())
    moments = [m for m in (sample, generation.created_at if generation else None, installing) if m is not None]
    return max(moments) if moments else None


def job_fail_if_stalled(*, job: TrainingJob, now: datetime | None = None) -> bool:
    """Fail a running (or recovering) job whose members all stopped reporting progress for longer
    than SPOTPIPE_JOB_STALL_TIMEOUT_S. Returns True when it did."""
    if job.status not in (JobStatus.RUNNING, JobStatus.RECOVERING):
        return False
    last = _last_progress(job)
    timeout = job_stall_timeout_s()
    if last is None or ((now or _now()) - last).total_seconds() <= timeout:
        return False
    return job_fail(
        job=job,
        reason=f"no progress for {timeout:.0f} s (last at {last.isoformat()}): its workers stopped reporting",
        data={"last_progress": last.isoformat()},
    )


def _workers_done(job: TrainingJob) -> bool:
    """Every member of the current generation reported its worker's clean exit."""
    generation = job_current_generation(job=job)
    members = {m["instance"] for m in (generation.membership if generation else [])}
    exited = set(
        JobEvent.objects.filter(job=job, kind="agent_worker_exit", data__code=0).values_list(
            "data__instance", flat=True
        )
    )
    return members <= exited


@transaction.atomic
def job_finish(*, job: TrainingJob) -> bool:
    """Mark the job finished once its steps are done and its workers have exited (or the grace
    period after the last step ran out). Idempotent."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES or locked.steps_done < locked.target_steps:
        return False
    reached = (
        MetricSample.objects.filter(job=locked, step__gte=locked.target_steps)
        .order_by("at")
        .values_list("at", flat=True)
        .first()
    )
    if not _workers_done(locked) and reached is not None and _now() - reached < FINISH_GRACE:
        return False
    _job_set_status(locked, JobStatus.FINISHED, f"finished {locked.steps_done} steps")
    return True
