"""Processing claimed notices in batches (one transaction, bulk writes), the drain a worker runs,
and the periodic sweep that is the outbox's safety net. Claiming and marking the notice rows is
fleet's (`fleet.notices.claims`); what one notice does is `reaction`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from controlplane.fleet.bulk import bulk_update_by_pk
from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.fleet.notices.claims import (
    PROCESSED_FIELDS,
    notice_mark_processed,
    notice_record_failure,
    notices_claim_by_lane,
    notices_requeue_stale,
    notices_to_process,
    notices_waiting,
)
from controlplane.fleet.services import instances_moved_save
from controlplane.jobs.models import JobEvent
from controlplane.jobs.reconfiguration import current_generations, reconfigurations_create
from controlplane.orchestration.notices.reaction import InstanceMap, ReactionBatch, instance_keys, react
from controlplane.orchestration.services.generations import reconfigurations_apply_after_commit

logger = logging.getLogger(__name__)


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
        rows = notices_to_process(notice_ids=notice_ids)
        if not rows:
            return
        known = _lock_instances(rows)
        jobs = {i.job_id: i.job for found in known.values() for i in found if i.job is not None}
        batch = ReactionBatch(known=known, now=timezone.now(), generations=current_generations(jobs=jobs.values()))
        for notice in rows:
            react(notice, batch)
            notice_mark_processed(notice, batch.now)
        instances_moved_save(moved=list(batch.moved.values()), events=batch.instance_events, at=batch.now)
        JobEvent.objects.bulk_create(batch.job_events)
        # One reconfiguration per leaving node, applied by orchestration once this commits.
        reconfigurations_apply_after_commit(reconfigurations=reconfigurations_create(drafts=batch.drafts))
        bulk_update_by_pk(InterruptionNotice, rows, PROCESSED_FIELDS)


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
        agents, others = notices_claim_by_lane(limit=batch_size)
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
            result.more = notices_waiting()
            return result


def notices_sweep(*, batch_size: int = 200, time_budget_s: float = 5.0) -> DrainResult:
    """The periodic safety net: requeue stale claims, then drain the backlog."""
    requeued = notices_requeue_stale()
    if requeued:
        logger.warning("requeued %d notices that were claimed but never processed", requeued)
    return notices_drain(batch_size=batch_size, time_budget_s=time_budget_s)
