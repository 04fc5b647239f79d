"""Stopping a job at a limit (its budget, its team's monthly budget, `max_runtime_s`, `max_wait_s`)
without losing its work: the job turns `stopping`, its agents ask the runtime to stop (the runtime's
members agree on a step in their step commit, write the checkpoint of that step and exit), and once a
complete checkpoint of that step or later is in the job's folder the job ends `stopped` with its
`end_reason`, and the reconcile releases every node. A job that trains nothing at the moment (no
generation yet, or waiting for capacity) stops at once; one whose checkpoint does not complete within
`SPOTPIPE_STOP_CHECKPOINT_WAIT_S` stops anyway, and a resume continues from its newest complete
checkpoint (the `job_stopped` event says which)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobEvent, JobStatus, TrainingJob
from controlplane.orchestration.enqueue import enqueue_on_commit
from controlplane.orchestration.services.transitions import _job_set_status, _lock_job, _now
from controlplane.tunables import tunable

logger = logging.getLogger(__name__)

STOPPING_EVENT = "job_stopping"
TRAINING = frozenset({JobStatus.RUNNING, JobStatus.RECOVERING})
"""Statuses in which the job's runtime trains, so a stop writes a checkpoint first."""


def stop_checkpoint_wait_s() -> float:
    return float(tunable("SPOTPIPE_STOP_CHECKPOINT_WAIT_S"))


@transaction.atomic
def job_request_stop(*, job: TrainingJob, end_reason: str, message: str, data: dict | None = None,
                     now: datetime | None = None, requeue: bool = False, move: dict[str, Any] | None = None) -> bool:
    """Ask an active job to checkpoint and stop with `end_reason` (`EndReason`), or, with
    `requeue` (it gives back borrowed quota), to checkpoint and go back to its team's queue, or,
    with `move` (`region_move`'s from, to and price), to checkpoint and move region. A job that is
    not training stops at once. False when it is not active or is stopping already, and for a move
    when it is not training (nothing to checkpoint: the caller moves it at once)."""
    from controlplane.orchestration import tasks

    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES or locked.status == JobStatus.STOPPING:
        return False
    training = locked.status in TRAINING and bool(locked.current_generation)
    if move is not None and not training:
        return False  # nothing to checkpoint first: the caller moves it at once
    locked.stop_requested_at = now or _now()
    locked.end_reason = end_reason  # what it will end with; the page shows it while stopping
    locked.save(update_fields=["stop_requested_at", "end_reason", "updated_at"])
    details = {"end_reason": end_reason, "at_step": locked.steps_done, "requeue": requeue, **(data or {})}
    if move is not None:
        details["move"] = move
    if training:
        then = "moving" if move is not None else "stopping"
        _job_set_status(locked, JobStatus.STOPPING, f"{message}: writing a checkpoint, then {then}", data=details)
    else:
        _stopped(locked, f"{message}: stopped (it was not training)", requeue=requeue, checkpoint=None,
                 data=details)
    enqueue_on_commit(tasks.reconcile_job, locked.pk)
    job.refresh_from_db()
    return True


def give_back_quota(job: TrainingJob, message: str) -> bool:
    """`jobs.admission.GiveBack`: `job` gives back borrowed quota: it checkpoints and goes back to
    its team's queue."""
    return job_request_stop(job=job, end_reason="", requeue=True, message=message)


def _stopped(locked: TrainingJob, message: str, *, requeue: bool, checkpoint: int | None, data: dict) -> None:
    """The stop's end: `stopped` with its end reason, or back in the queue from the checkpoint (its
    nodes are released by the reconcile either way: neither status is active)."""
    if not requeue:
        _job_set_status(locked, JobStatus.STOPPED, message, end_reason=locked.end_reason, data=data)
        return
    from controlplane.jobs.services import REQUEUED_EVENT, job_record_event, job_restart_from

    if locked.status == JobStatus.STOPPING:  # it trained: it continues from what its stop left
        submitted_init = job_restart_from(locked, checkpoint=checkpoint)
        job_record_event(job=locked, kind=REQUEUED_EVENT, message=f"back in the queue from step {checkpoint or 0}",
                         data={"from_step": checkpoint or 0, "from_checkpoint": checkpoint is not None,
                               "submitted_init_from": submitted_init})
    locked.stop_requested_at = None
    locked.save(update_fields=["stop_requested_at", "updated_at"])
    _job_set_status(locked, JobStatus.QUEUED, f"{message}; back in the queue", data=data)


def job_stop_progress(*, job: TrainingJob, now: datetime | None = None) -> bool:
    """End a stopping job `stopped` once its checkpoint is complete (a complete checkpoint of the
    step it had reached when asked, or later) or the wait for it ran out. Returns True when it ended."""
    from controlplane.jobs.artifacts import job_latest_checkpoint

    if job.status != JobStatus.STOPPING:
        return False
    now = now or _now()
    asked = JobEvent.objects.filter(job=job, kind=STOPPING_EVENT).order_by("-at", "-id").first()
    at_step = int((asked.data if asked else {}).get("at_step") or 0)
    checkpoint = job_latest_checkpoint(job=job)  # listed outside the lock: the store may be S3
    written = checkpoint is not None and checkpoint >= at_step
    waited = (now - (job.stop_requested_at or now)).total_seconds()
    if not written and waited < stop_checkpoint_wait_s():
        return False
    move = (asked.data if asked else {}).get("move")
    if move:
        from controlplane.orchestration.services.region_move import region_move_after_checkpoint

        region_move_after_checkpoint(job=job, move=move, checkpoint=checkpoint, now=now)
        job.refresh_from_db()
        return True
    requeue = bool((asked.data if asked else {}).get("requeue"))
    why = "borrowed quota given back" if requeue else job.end_reason
    with transaction.atomic():
        locked = _lock_job(job)
        if locked.status != JobStatus.STOPPING:
            return False
        if written:
            message = f"stopped ({why}) at its checkpoint of step {checkpoint}"
        else:
            message = (f"stopped ({why}): no checkpoint completed within {waited:.0f} s; it "
                       + (f"continues from step {checkpoint}" if checkpoint is not None else "starts from step 0"))
        _stopped(locked, message, requeue=requeue, checkpoint=checkpoint,
                 data={"checkpoint": checkpoint, "checkpoint_written": written, "waited_s": round(waited, 1),
                       "requeue": requeue})
    job.refresh_from_db()
    logger.info("job %s: %s", job.pk, message)
    return True
