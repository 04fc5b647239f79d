"""The end of a job: failed (its runtime cannot go on, its requirements cannot be installed, it
stalled) or finished (its steps are done and its workers have exited)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from controlplane.fleet.models import Instance
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, EndReason, JobEvent, JobStatus, MetricSample, TrainingJob
from controlplane.orchestration.enqueue import enqueue_on_commit
from controlplane.orchestration.selectors import job_current_generation
from controlplane.orchestration.services.transitions import _job_set_status, _lock_job, _now
from controlplane.tunables import tunable
from runtime.worker_exits import EXIT_FENCED, EXIT_JOB_FAILED, NOT_CRASHES

# After the last step, how long to wait for the members' workers to exit on their own (they save
# their final state) before the job is declared finished and its nodes released anyway.
FINISH_GRACE = timedelta(seconds=30)
RUN_STARTS = ("submitted", "resumed")
"""Timeline kinds a run of the job starts at: its limits count from the newest."""

def job_stall_timeout_s() -> float:
    """Seconds a running job may go without progress (a committed step, a new generation) before
    the reconcile loop fails it: the safety net for a runtime that died without saying why."""
    return tunable("SPOTPIPE_JOB_STALL_TIMEOUT_S")


@transaction.atomic
def job_fail(*, job: TrainingJob, reason: str, end_reason: str, data: dict | None = None,
             exit_code: int | None = None, end_log: str = "") -> bool:
    """Mark an active job failed with `reason` on its timeline and `end_reason` (`EndReason`) on
    the job (the status alert goes out with the status change) and release its nodes once this
    commits. Idempotent: False when it had ended."""
    # Imported here, not at the top: the tasks module imports these services (its tasks wrap them)
    # and the task enqueued here calls them back, a true import cycle.
    from controlplane.orchestration import tasks

    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES:
        return False
    if exit_code is not None or end_log:
        locked.exit_code, locked.end_log = exit_code, end_log
        locked.save(update_fields=["exit_code", "end_log", "updated_at"])
    _job_set_status(locked, JobStatus.FAILED, reason, data={"reason": reason, **(data or {})}, end_reason=end_reason)
    enqueue_on_commit(tasks.reconcile_job, locked.pk)
    return True


def run_started_at(job: TrainingJob) -> datetime | None:
    """When the job's current run began: its submission, or its newest resume."""
    return (JobEvent.objects.filter(job=job, kind__in=RUN_STARTS).order_by("-at", "-id")
            .values_list("at", flat=True).first())


def job_crashes(job: TrainingJob) -> int:
    """Worker crashes of the job's current run (exits other than `NOT_CRASHES`: its code raised);
    a preempted node's worker reports no exit, so preemptions never count."""
    crashes = JobEvent.objects.filter(job=job, kind="agent_worker_exit", data__code__isnull=False).exclude(
        data__code__in=sorted(NOT_CRASHES))
    since = run_started_at(job)
    return crashes.filter(at__gte=since).count() if since else crashes.count()


def worker_exit_report(*, instance: Instance, code: int | None, reason: str, generation: int | None,
                       log_tail: list[str] | None = None) -> bool:
    """An agent's worker exited. When its runtime said the job cannot go on, the job fails with
    that reason (`no_checkpoint`: strategies that restart from a checkpoint do so inside the
    runtime, so a failure that reaches here had nothing to restart from). A crash (the job's code
    raised) is restarted by the agent until the job's crashes exceed `max_restarts_on_errors`: then
    the job fails `user_error` with the exit code and the log's last lines. Returns True when the
    job was failed."""
    job = instance.job
    if job is None or code is None or code in (0, EXIT_FENCED):
        return False
    if code == EXIT_JOB_FAILED:
        return job_fail(job=job, reason=f"runtime cannot continue: {reason or 'no reason given'}",
                        end_reason=EndReason.NO_CHECKPOINT, data={"instance": instance.pk, "generation": generation})
    crashes = job_crashes(job)
    if crashes <= job.max_restarts_on_errors:
        return False
    return job_fail(job=job, end_reason=EndReason.USER_ERROR, exit_code=code, end_log="\n".join(log_tail or []),
                    reason=f"its worker crashed {crashes} time(s) (exit code {code}), more than max_restarts_on_errors="
                    f"{job.max_restarts_on_errors}", data={"instance": instance.pk, "generation": generation,
                                                          "crashes": crashes})


def requirements_failed_report(*, instance: Instance, reason: str) -> bool:
    """An agent could not install the job's requirements (`config.requirements`): the job fails
    with pip's last lines. Every node would fail the same way, so no replacement is bought and the
    agent does not retry. Returns True when the job was failed (False: it had ended already)."""
    if instance.job is None:
        return False
    return job_fail(job=instance.job, reason=f"requirements could not be installed: {reason or 'no reason given'}",
                    end_reason=EndReason.CONFIG_ERROR, data={"instance": instance.pk})


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
        end_reason=EndReason.STALLED, data={"last_progress": last.isoformat()},
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
