"""The job-reconfiguration service: the one place that decides how a job reacts to a node leaving
or joining. This module records the decision *input* idempotently; the orchestration issue fills
in the decision itself (re-route, take over, re-instantiate, restart) from that input."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.jobs.models import JobGeneration, Reconfiguration, TrainingJob

if TYPE_CHECKING:
    from controlplane.fleet.models import Instance, InterruptionNotice


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def reconfiguration_decision_input(
    *, job: TrainingJob, instance: Instance | None, notice: InterruptionNotice | None
) -> dict:
    """What the decision needs to know, as JSON: strategy, the leaving instance, the membership of
    the job's current generation, and how long is left before the VM goes (the notice's lead time)."""
    now = timezone.now()
    generation = JobGeneration.objects.filter(job=job, number=job.current_generation).first()
    membership = list(generation.membership) if generation else []
    leaving_id = instance.pk if instance else None
    member = next((m for m in membership if isinstance(m, dict) and m.get("instance") == leaving_id), None)
    deadline = notice.deadline if notice else None
    return {
        "strategy": job.strategy,
        "job_status": job.status,
        "generation": job.current_generation,
        "membership": membership,
        "leaving_instance": None if instance is None else {
            "id": instance.pk,
            "provider_instance_id": instance.provider_instance_id,
            "state": instance.state,
            "member": member,
        },
        "survivors": sum(1 for m in membership if isinstance(m, dict) and m.get("instance") != leaving_id),
        "notice": None if notice is None else {
            "id": notice.pk,
            "source": notice.source,
            "kind": notice.kind,
            "action": notice.action,
            "event_time": _iso(notice.event_time),
            "deadline": _iso(deadline),
            "received_at": _iso(notice.received_at),
        },
        "decided_at": now.isoformat(),
        # Seconds left between deciding and the VM going away; negative when it is already gone.
        "lead_time_s": None if deadline is None else round((deadline - now).total_seconds(), 3),
    }


def reconfiguration_decide(
    *,
    job: TrainingJob,
    trigger: str,
    trigger_key: str,
    instance: Instance | None = None,
    notice: InterruptionNotice | None = None,
) -> Reconfiguration:
    """Record (once per `(job, trigger_key)`) that `job` must reconfigure, with the decision input.

    A replayed notice, a second notice for the same leaving node, or a task that runs twice finds
    the existing row and returns it unchanged."""
    existing = Reconfiguration.objects.filter(job=job, trigger_key=trigger_key).first()
    if existing is not None:
        return existing
    decision_input = reconfiguration_decision_input(job=job, instance=instance, notice=notice)
    try:
        # A savepoint, so a concurrent winner's row does not break the caller's transaction.
        with transaction.atomic():
            return Reconfiguration.objects.create(
                job=job,
                trigger=trigger,
                trigger_key=trigger_key,
                strategy=job.strategy,
                decision_input=decision_input,
                instance=instance,
                notice=notice,
                from_generation=job.current_generation,
                decided_at=timezone.now(),
            )
    except IntegrityError:
        return Reconfiguration.objects.get(job=job, trigger_key=trigger_key)
