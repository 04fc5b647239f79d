"""Claiming stored notices and processing them in batches (one transaction, bulk writes), the
drain a worker runs, retries, and the periodic sweep that is the outbox's safety net."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import OperationalError, connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from controlplane.fleet.bulk import bulk_update_by_pk
from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance, InterruptionNotice, NoticeSource, NoticeStatus
from controlplane.fleet.notices.handoff import notices_handoff
from controlplane.fleet.notices.reaction import InstanceMap, ReactionBatch, instance_keys, react
from controlplane.fleet.services import instances_moved_save
from controlplane.jobs.models import JobEvent
from controlplane.jobs.reconfiguration import current_generations, reconfigurations_create
from controlplane.orchestration.services.applying import reconfigurations_apply_after_commit

logger = logging.getLogger(__name__)

# A claim not processed within this long is put back (the worker died); after MAX_ATTEMPTS claims
# a notice is marked failed and waits for an operator's retry.
CLAIM_STALE_AFTER = timedelta(seconds=30)
MAX_ATTEMPTS = 5


# Agents' own notices are claimed first, however many cloud notices wait: an agent speaks for a node
# that runs a job, while a webhook burst is mostly duplicates and nodes of no job, and its backlog
# (thousands of rows, seconds of processing) must not sit between a job and its reaction.
_AGENTS_FIRST = Case(When(source=NoticeSource.AGENT, then=Value(0)), default=Value(1))


def notices_claim(*, limit: int) -> list[int]:
    """Claim up to `limit` received notices, agents' first, then oldest first, for this worker: mark
    them enqueued and count the attempt. On PostgreSQL concurrent drains skip each other's locked
    rows; on SQLite the immediate transaction serialises them."""
    agents, others = _claim_by_lane(limit=limit)
    return agents + others


def _claim_by_lane(*, limit: int) -> tuple[list[int], list[int]]:
    """`notices_claim`, split into (agents' notices, the rest), so a drain can react to the agents'
    in a transaction of their own before the rest of a burst's batch."""
    with transaction.atomic():
        qs = InterruptionNotice.objects.filter(status=NoticeStatus.RECEIVED).order_by(
            _AGENTS_FIRST, "received_at", "id"
        )
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        rows = list(qs.values_list("id", "source")[:limit])
        if rows:
            InterruptionNotice.objects.filter(id__in=[pk for pk, _ in rows]).update(
                status=NoticeStatus.ENQUEUED, enqueued_at=timezone.now(), attempts=F("attempts") + 1
            )
    agents = [pk for pk, source in rows if source == NoticeSource.AGENT]
    return agents, [pk for pk, source in rows if source != NoticeSource.AGENT]


_DONE_FIELDS = ["status", "processed_at", "error", "unknown_instance", "instance", "team"]


def _mark_processed(notice: InterruptionNotice, at: datetime | None = None) -> None:
    notice.status = NoticeStatus.PROCESSED
    notice.processed_at = at or timezone.now()
    notice.error = ""


def notice_process(*, notice_id: int) -> InterruptionNotice | None:
    """React to one notice exactly once, as a batch of one (`notices_process_batch`'s path): a
    processed notice is left alone, so a redelivered task or an overlapping drain does nothing the
    second time. Raises what the reaction raises."""
    _process_together([notice_id])
    return InterruptionNotice.objects.filter(pk=notice_id).first()


def _lock_instances(rows: list[InterruptionNotice]) -> InstanceMap:
    """Lock and load every instance the batch may move, and their jobs before them
    (`lock_jobs_then_instances`, the order orchestration locks in): the batch's rows share-lock
    those jobs when it commits, so locking the instances alone first deadlocked against
    orchestration, which locks a job and then its instances. Only the notices' teams' instances,
    unless a notice has no team (its instance is looked up by id alone)."""
    keys = {key for notice in rows for key in instance_keys(notice)}
    if not keys:
        return {}
    qs = Instance.objects.filter(provider_instance_id__in=keys)
    teams = {notice.team_id for notice in rows}
    if None not in teams:
        qs = qs.filter(team_id__in=teams)
    _jobs, instances = lock_jobs_then_instances(instances=qs)
    known: InstanceMap = {}
    for instance in instances:
        known.setdefault(instance.provider_instance_id, []).append(instance)
    return known


def _process_together(notice_ids: list[int]) -> None:
    """Process notices in one transaction with a constant number of statements for the batch's own
    rows: lock the notices, then their instances' jobs and the instances (the one lock order,
    `_lock_instances`), read the jobs' current generations when any has one, then one insert each
    for the instance and job events, one query for the reconfigurations already decided and one
    insert for the new ones, and one update each for the instances and the notices. Orchestration applies the new
    reconfigurations together once this commits."""
    with transaction.atomic():
        rows = list(
            InterruptionNotice.objects.select_for_update()
            .filter(id__in=notice_ids)
            .exclude(status__in=[NoticeStatus.PROCESSED, NoticeStatus.FAILED])
            .order_by("id")
        )
        if not rows:
            return
        known = _lock_instances(rows)
        jobs = {i.job_id: i.job for found in known.values() for i in found if i.job is not None}
        batch = ReactionBatch(known=known, now=timezone.now(), generations=current_generations(jobs=jobs.values()))
        for notice in rows:
            react(notice, batch)
            _mark_processed(notice, batch.now)
        instances_moved_save(moved=list(batch.moved.values()), events=batch.instance_events, at=batch.now)
        JobEvent.objects.bulk_create(batch.job_events)
        # One reconfiguration per leaving node, applied by orchestration once this commits.
        reconfigurations_apply_after_commit(reconfigurations=reconfigurations_create(drafts=batch.drafts))
        bulk_update_by_pk(InterruptionNotice, rows, _DONE_FIELDS)


# PostgreSQL's answers that mean "run the transaction again": a deadlock (40P01) and a
# serialization failure (40001). The batch takes its locks in orchestration's order
# (`lock_jobs_then_instances`), so a deadlock is left only to a path outside that rule; this
# stays as the safety net.
RETRY_SQLSTATES = frozenset({"40P01", "40001"})
RETRIES = 3


def _retryable(exc: BaseException) -> bool:
    cause = exc.__cause__ if isinstance(exc, OperationalError) else None
    return getattr(cause, "sqlstate", None) in RETRY_SQLSTATES


def _process_together_retrying(notice_ids: list[int]) -> None:
    """`_process_together`, run again (at once, then after a short pause) when the database chose
    it as a deadlock's victim: the other transaction has gone on, so the next attempt gets its
    locks; without this the notice would wait for the sweep (CLAIM_STALE_AFTER) and a noticed node
    could be gone before its job reacted."""
    for attempt in range(RETRIES):
        try:
            _process_together(notice_ids)
            return
        except OperationalError as exc:
            if not _retryable(exc) or attempt == RETRIES - 1:
                raise
            logger.warning("notices %s: %s; processing them again", notice_ids[:5], exc.__cause__.sqlstate)
            time.sleep(0.05 * attempt)


def notices_process_batch(*, notice_ids: list[int]) -> tuple[int, int]:
    """Process claimed notices together (one commit for the batch rather than one per notice: on a
    busy disk the commit is most of the wall time; see `_process_together`). If any notice fails,
    the batch is rolled back and each notice is processed as a batch of its own, so one bad notice
    cannot block the rest; its error is kept for the sweep's retry. Returns (processed, failed)."""
    try:
        _process_together_retrying(notice_ids)
        return len(notice_ids), 0
    except Exception as exc:
        if len(notice_ids) == 1:
            logger.exception("processing notice %s failed", notice_ids[0])
            notice_record_failure(notice_id=notice_ids[0], error=f"{type(exc).__name__}: {exc}")
            return 0, 1
        logger.warning("batch of %d notices failed; processing them one by one", len(notice_ids), exc_info=True)
    processed = failed = 0
    for notice_id in notice_ids:
        done, lost = notices_process_batch(notice_ids=[notice_id])
        processed += done
        failed += lost
    return processed, failed


def notice_record_failure(*, notice_id: int, error: str) -> None:
    """Keep a failed attempt's error; the row stays claimed and the sweep retries it after
    CLAIM_STALE_AFTER, or gives up after MAX_ATTEMPTS."""
    InterruptionNotice.objects.filter(pk=notice_id).exclude(status=NoticeStatus.PROCESSED).update(error=error[:2000])


@dataclass(kw_only=True, slots=True)
class DrainResult:
    processed: int = 0
    failed: int = 0
    batches: int = 0
    more: bool = False


def _chunk_size() -> int:
    """Notices per processing transaction. A transaction costs the same statements for 1 or 200
    notices, so bigger is cheaper per notice (drain_notices in process, 2,400 bench notices,
    PostgreSQL: 0.62-0.65 ms of CPU per notice in chunks of 50, 0.49-0.52 in chunks of 200); on
    SQLite, short transactions keep its single writer free for the web requests' inserts."""
    return 200 if connection.vendor == "postgresql" else 50


def notices_drain(
    *, batch_size: int = 200, chunk_size: int | None = None, time_budget_s: float = 5.0, paced: bool = False
) -> DrainResult:
    """Claim and process received notices in batches until none are left or the time budget is
    spent (then `more` is set so the caller can re-kick rather than hold the worker). Each claimed
    batch is processed in transactions of `chunk_size` notices (default `_chunk_size()`). `paced`
    (the kicked drain, after `drain_pace`): stop once a claim comes back short of `batch_size`."""
    chunk_size = chunk_size or _chunk_size()
    result = DrainResult()
    started = time.monotonic()
    while True:
        agents, others = _claim_by_lane(limit=batch_size)
        ids = agents + others
        if not ids:
            return result
        result.batches += 1
        # The agents' notices commit first, on their own: their jobs react without waiting for a
        # chunk of a burst's cloud notices (docs/webhooks.md, "Agents' notices first").
        chunks = [agents] if agents else []
        chunks += [others[start : start + chunk_size] for start in range(0, len(others), chunk_size)]
        for chunk in chunks:
            processed, failed = notices_process_batch(notice_ids=chunk)
            result.processed += processed
            result.failed += failed
        if paced and len(ids) < batch_size:
            # Caught up: what arrives from now on gets its own (paced) drain from the next kick,
            # rather than a stream of small claims from this one.
            return result
        if time.monotonic() - started > time_budget_s:
            result.more = InterruptionNotice.objects.filter(status=NoticeStatus.RECEIVED).exists()
            return result


def notice_retry(*, notice: InterruptionNotice) -> InterruptionNotice:
    """Give a failed notice (MAX_ATTEMPTS spent) another round: back to received with its attempts
    reset (its last error kept until it is processed), handed to the workers on commit exactly as
    a new one. Any other status is a Conflict: a processed notice is never reacted to twice."""
    from controlplane.common.errors import Conflict

    with transaction.atomic():
        locked = InterruptionNotice.objects.select_for_update().get(pk=notice.pk)
        if locked.status != NoticeStatus.FAILED:
            raise Conflict(f"notice {locked.pk} is {locked.status}; only a failed notice is retried", field="status")
        locked.status = NoticeStatus.RECEIVED
        locked.attempts = 0
        locked.enqueued_at = None
        locked.save(update_fields=["status", "attempts", "enqueued_at"])
        transaction.on_commit(lambda: notices_handoff(notice_ids=[locked.pk]))
    return locked


def notices_requeue_stale(*, older_than: timedelta = CLAIM_STALE_AFTER) -> int:
    """Put back notices claimed long ago and never processed (the worker died, or processing
    failed), so the next drain retries them; give up after MAX_ATTEMPTS."""
    cutoff = timezone.now() - older_than
    stale = InterruptionNotice.objects.filter(status=NoticeStatus.ENQUEUED, enqueued_at__lt=cutoff)
    stale.filter(attempts__gte=MAX_ATTEMPTS).update(status=NoticeStatus.FAILED)
    return stale.filter(attempts__lt=MAX_ATTEMPTS).update(status=NoticeStatus.RECEIVED)


def notices_sweep(*, batch_size: int = 200, time_budget_s: float = 5.0) -> DrainResult:
    """The periodic safety net: requeue stale claims, then drain the backlog."""
    requeued = notices_requeue_stale()
    if requeued:
        logger.warning("requeued %d notices that were claimed but never processed", requeued)
    return notices_drain(batch_size=batch_size, time_budget_s=time_budget_s)
