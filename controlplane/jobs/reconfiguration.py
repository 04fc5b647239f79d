"""The job-reconfiguration service: the one place that decides how a job reacts to a node leaving
or joining. This module records the decision *input* idempotently; the orchestration issue fills
in the decision itself (re-route, take over, re-instantiate, restart) from that input.

Two forms, with the same rows as a result: `reconfiguration_decide` records one decision (a few
statements), and `reconfiguration_draft` + `reconfigurations_create` record a batch of them (the
notice processor's) with a constant number of statements: one query for the jobs' current
generations, one for the decisions already recorded, one insert. Applying a decision (publishing
the next generation) is orchestration's: the decider calls
`orchestration.services.reconfigurations_apply_after_commit` with what this module recorded."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.jobs.models import JobGeneration, Reconfiguration, TrainingJob

if TYPE_CHECKING:
    from controlplane.fleet.models import Instance, InterruptionNotice

_QUERY = object()  # "look the generation up" (the one-decision form)


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def reconfiguration_decision_input(
    *,
    job: TrainingJob,
    instance: Instance | None,
    notice: InterruptionNotice | None,
    generation: JobGeneration | object | None = _QUERY,
    now: datetime | None = None,
) -> dict:
    """What the decision needs to know, as JSON: strategy, the leaving instance and its place in the
    job's current generation (its number; the membership itself is that generation's, not copied:
    a zone that reclaims 64 of a 1,024-node job's nodes decides 64 reconfigurations at once, and 64
    copies of a 1,024-member list made their insert take a second), the number of survivors, and
    how long is left before the VM goes (the notice's lead time).

    `generation` is the job's current generation when the caller already read it (a batch reads
    them all in one query); otherwise it is looked up."""
    now = now or timezone.now()
    if generation is _QUERY:
        generation = JobGeneration.objects.filter(job=job, number=job.current_generation).first()
    membership = list(generation.membership) if generation else []
    leaving_id = instance.pk if instance else None
    member = next((m for m in membership if isinstance(m, dict) and m.get("instance") == leaving_id), None)
    deadline = notice.deadline if notice else None
    return {
        "strategy": job.strategy,
        "job_status": job.status,
        "generation": job.current_generation,
        "members": len(membership),
        "leaving_instance": None
        if instance is None
        else {
            "id": instance.pk,
            "provider_instance_id": instance.provider_instance_id,
            "state": instance.state,
            "member": member,
        },
        "survivors": sum(1 for m in membership if isinstance(m, dict) and m.get("instance") != leaving_id),
        "notice": None
        if notice is None
        else {
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


def reconfiguration_draft(
    *,
    job: TrainingJob,
    trigger: str,
    trigger_key: str,
    instance: Instance | None = None,
    notice: InterruptionNotice | None = None,
    generation: JobGeneration | object | None = _QUERY,
) -> Reconfiguration:
    """The row `reconfiguration_decide` would insert, not saved: its decision input is taken now
    (the instance's state as it is at this moment), so a batch that records it later records the
    same thing."""
    now = timezone.now()
    return Reconfiguration(
        job=job,
        trigger=trigger,
        trigger_key=trigger_key,
        strategy=job.strategy,
        decision_input=reconfiguration_decision_input(
            job=job, instance=instance, notice=notice, generation=generation, now=now
        ),
        instance=instance,
        notice=notice,
        from_generation=job.current_generation,
        decided_at=now,
    )


def current_generations(*, jobs: Iterable[TrainingJob]) -> dict[int, JobGeneration]:
    """The current generation of each job, in one query (none when no job has one yet)."""
    numbers = {job.pk: job.current_generation for job in jobs if job.current_generation}
    if not numbers:
        return {}
    # The numbers as the caller read them (what `job.current_generation` says), as one lookup each.
    condition = Q()
    for job_id, number in numbers.items():
        condition |= Q(job_id=job_id, number=number)
    return {generation.job_id: generation for generation in JobGeneration.objects.filter(condition)}


def reconfigurations_create(*, drafts: list[Reconfiguration]) -> list[Reconfiguration]:
    """Record a batch of drafts, once per `(job, trigger_key)`: the first draft of a key wins, and a
    key already recorded is skipped (what `reconfiguration_decide` for each draft in turn would
    do). Two statements: one query for the keys already recorded, one insert. Returns the new rows.

    Callers hold the leaving instances' row locks (as every decider of a `leave:instance:` key
    does), so no concurrent decider can insert one of these keys in between; if one did, the
    insert fails and the caller's transaction with it (the notice batch then falls back to one by
    one)."""
    wanted: dict[tuple[int, str], Reconfiguration] = {}
    for draft in drafts:
        wanted.setdefault((draft.job_id, draft.trigger_key), draft)
    if not wanted:
        return []
    done = Reconfiguration.objects.filter(
        job_id__in={job_id for job_id, _ in wanted}, trigger_key__in={key for _, key in wanted}
    ).values_list("job_id", "trigger_key")
    for pair in done:  # a superset of what we asked for: pairs we did not ask about are ignored
        wanted.pop(pair, None)
    if not wanted:
        return []
    return Reconfiguration.objects.bulk_create(list(wanted.values()))


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
    draft = reconfiguration_draft(job=job, trigger=trigger, trigger_key=trigger_key, instance=instance, notice=notice)
    try:
        # A savepoint, so a concurrent winner's row does not break the caller's transaction.
        with transaction.atomic():
            draft.save(force_insert=True)
            return draft
    except IntegrityError:
        return Reconfiguration.objects.get(job=job, trigger_key=trigger_key)
