"""Moving a job's status (and telling the team's alert URLs) and an instance's state (and keeping its
billing in step), for the orchestration services; and their clock."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane.billing.services import billing_close, billing_close_many, billing_open
from controlplane.fleet.locks import lock_instance, lock_job
from controlplane.fleet.models import Instance
from controlplane.fleet.services import instance_transition, instance_transition_locked, instances_moved_save
from controlplane.fleet.states import ALLOWED_TRANSITIONS, TERMINAL_STATES, InstanceState
from controlplane.jobs.models import JOB_TRANSITIONS, JobStatus, TrainingJob
from controlplane.jobs.services import job_set_status
from controlplane.webhooks.alerts import alert_job_status

logger = logging.getLogger(__name__)


def _now() -> datetime:
    return timezone.now()


def _lock_job(job: TrainingJob) -> TrainingJob:
    return lock_job(job)


def _job_set_status(job: TrainingJob, status: str, message: str, *, data: dict | None = None,
                    end_reason: str = "") -> None:
    """Move the job's status (the caller holds the job lock) and tell the team's alert URLs. A move
    the job's state machine refuses (a reaction that arrives after the job ended) changes nothing:
    a late event must not bring a failed or finished job back."""
    previous = job.status
    if status != previous and status not in JOB_TRANSITIONS[previous]:
        logger.warning("job %s stays %s: %s would be illegal (%s)", job.pk, previous, status, message)
        return
    if not job_set_status(job, status, message, data=data, end_reason=end_reason):
        return
    # Teams' outbound alert URLs hear of recovering / recovered / failed / finished.
    recovered = previous == JobStatus.RECOVERING and status == JobStatus.RUNNING
    alert_job_status(job=job, status="recovered" if recovered else status, message=message)


@transaction.atomic(savepoint=False)  # the caller's transaction when it has one (it should: the locks last)
def _transition(instance: Instance, to: str, *, detail: dict | None = None) -> bool:
    """Move an instance if the state machine allows it (and keep its billing in step). Locks its
    job and then it first (`lock_jobs_then_instances`): the event rows written here share-lock the
    job at commit, and a notice batch or a publish holds the job while it needs the instance."""
    lock_instance(instance)
    instance.refresh_from_db(fields=["state"])
    if instance.state == to or to not in ALLOWED_TRANSITIONS[instance.state]:
        return False
    instance_transition(instance=instance, to=to, detail=detail or {})
    # Billed from the very instant the instance's life starts and ends (its stamps), not from a
    # later clock reading: the ledger must cover its life exactly.
    if to == InstanceState.RUNNING:
        billing_open(instance=instance, at=instance.running_at)
    elif to in TERMINAL_STATES:
        billing_close(instance=instance, at=instance.ended_at)
    return True


def _end_locked_many(instances: list[Instance], to: str, *, detail: dict | None = None) -> list[Instance]:
    """`_transition` to the terminal state `to` of many instances whose rows (and jobs) the caller
    locked and loaded in this transaction (`lock_jobs_then_instances`), in bulk: one insert of their
    events, one update of their rows, one of their billing, one token revocation and one wake-up,
    not a round of each per instance (a 1,024-node job's release held its job lock 6 s that way).
    Returns the instances it moved."""
    assert to in TERMINAL_STATES
    at = _now()
    moved = [i for i in instances if i.state != to and to in ALLOWED_TRANSITIONS[i.state]]
    events = [instance_transition_locked(instance=i, to=to, at=at, detail=detail or {}) for i in moved]
    instances_moved_save(moved=moved, events=events, at=at)  # an ended node keeps no access
    billing_close_many(instances=moved)  # billed to its `ended_at`, as `_transition` does
    return moved
