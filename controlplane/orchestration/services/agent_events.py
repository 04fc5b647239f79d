"""What an agent reports of its workers (started, applied a generation, exited, could not install,
profile or prepare): the job's timeline, and the job's end when the report says it cannot go on.

Each event that acts does so once per (instance, event id): the agent's client retries a POST whose
answer it lost, and a worker exit counted twice would fail a job that was allowed a restart."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from controlplane.fleet.models import Instance
from controlplane.jobs.services import job_record_event
from controlplane.orchestration.enqueue import enqueue
from controlplane.orchestration.models import AgentEventReceipt
from controlplane.orchestration.services.job_end import requirements_failed_report, worker_exit_report
from controlplane.orchestration.services.prepare import prepare_failed_report
from controlplane.orchestration.services.profile import profile_failed_report
from controlplane.orchestration.services.transitions import _now

# A report that the job cannot go on: each fails it, with the reason.
_FAILURE_REPORTS = {"requirements_failed": requirements_failed_report, "profile_failed": profile_failed_report,
                    "prepare_failed": prepare_failed_report}
ACTING_KINDS = frozenset({"worker_exit", *_FAILURE_REPORTS})
"""The events that act; the others (started, applied a generation, spare, pip's output) only go on
the timeline."""


def agent_event(*, instance: Instance, kind: str, event_id: str = "", generation: int | None = None,
                step: int | None = None, code: int | None = None, message: str = "",
                log_tail: list[str] | None = None) -> bool:
    """Put the agent's event on its job's timeline and act on it (a worker exit may fail the job; a
    failed install, profile or prepare does). `event_id` (the agent's, kept across its retries)
    makes a replay of an event that acts act no more; without one (an older agent) every delivery
    acts. Returns True when it was recorded, False for a replay or an instance without a job."""
    job = instance.job
    if job is None:
        return False
    failed = False
    with transaction.atomic():  # the receipt commits with what the event did, or neither does
        # Only the events that act keep a receipt: one costs ~0.8 ms on PostgreSQL, and a generation
        # at 1,024 nodes brings 1,024 `generation_applied` (a replay of one is a second timeline row).
        if kind in ACTING_KINDS and event_id and not _first_delivery(instance=instance, event_id=event_id):
            return False
        job_record_event(
            job=job, kind=f"agent_{kind}",
            message=f"instance {instance.pk}: {kind}" + (f" ({message})" if message else ""),
            data={"instance": instance.pk, "generation": generation, "step": step, "code": code, "reason": message,
                  **({"log_tail": log_tail} if log_tail else {})},
        )
        if kind == "worker_exit":
            failed = worker_exit_report(instance=instance, code=code, reason=message, generation=generation,
                                        log_tail=log_tail)
        elif kind in _FAILURE_REPORTS:
            _FAILURE_REPORTS[kind](instance=instance, reason=message)
    if kind == "worker_exit" and not failed:  # a failed job's release is enqueued by job_fail
        # Imported here: the tasks module imports these services (a true import cycle).
        from controlplane.orchestration import tasks

        enqueue(tasks.reconcile_job, job.pk)
    return True


def _first_delivery(*, instance: Instance, event_id: str) -> bool:
    """Record the event's receipt; False when it was recorded before (a replay). A delivery racing
    the first waits on the unique key until that one commits, then finds it."""
    try:
        with transaction.atomic():  # a savepoint: the conflict must not spoil the caller's transaction
            AgentEventReceipt.objects.create(instance=instance, event_id=event_id, received_at=_now())
    except IntegrityError:
        if not AgentEventReceipt.objects.filter(instance=instance, event_id=event_id).exists():
            raise  # not the unique key (the instance went away meanwhile)
        return False
    return True
