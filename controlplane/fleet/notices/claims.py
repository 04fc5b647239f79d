"""Claiming stored notices for a worker, marking them processed or failed, putting back claims a
worker dropped, and an operator's retry. The reaction itself (what a notice does to its instance
and job) is orchestration's (`controlplane.orchestration.notices`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from controlplane.fleet.models import InterruptionNotice, NoticeSource, NoticeStatus
from controlplane.fleet.notices.handoff import notices_handoff

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
    agents, others = notices_claim_by_lane(limit=limit)
    return agents + others


def notices_claim_by_lane(*, limit: int) -> tuple[list[int], list[int]]:
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


def notices_to_process(*, notice_ids: list[int]) -> list[InterruptionNotice]:
    """The claimed notices among `notice_ids` not yet processed or failed, locked for the caller's
    transaction, in id order: a processed notice is never reacted to twice."""
    return list(
        InterruptionNotice.objects.select_for_update()
        .filter(id__in=notice_ids)
        .exclude(status__in=[NoticeStatus.PROCESSED, NoticeStatus.FAILED])
        .order_by("id")
    )


# The fields `notice_mark_processed` (and the reaction: instance, team, unknown_instance) change.
PROCESSED_FIELDS = ["status", "processed_at", "error", "unknown_instance", "instance", "team"]


def notice_mark_processed(notice: InterruptionNotice, at: datetime | None = None) -> None:
    """Mark a notice processed in memory; the caller writes `PROCESSED_FIELDS` in bulk."""
    notice.status = NoticeStatus.PROCESSED
    notice.processed_at = at or timezone.now()
    notice.error = ""


def notice_record_failure(*, notice_id: int, error: str) -> None:
    """Keep a failed attempt's error; the row stays claimed and the sweep retries it after
    CLAIM_STALE_AFTER, or gives up after MAX_ATTEMPTS."""
    InterruptionNotice.objects.filter(pk=notice_id).exclude(status=NoticeStatus.PROCESSED).update(error=error[:2000])


def notices_waiting() -> bool:
    """Whether any stored notice waits to be claimed."""
    return InterruptionNotice.objects.filter(status=NoticeStatus.RECEIVED).exists()


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
