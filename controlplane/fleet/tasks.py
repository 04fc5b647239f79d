"""Celery tasks of the fleet app: thin wrappers over `fleet.notices` (ids in, no objects)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError

from controlplane.fleet import notices

logger = logging.getLogger(__name__)


@shared_task(
    name="fleet.drain_notices", acks_late=True, ignore_result=True,
    autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3,
)
def drain_notices() -> dict:
    """Claim stored notices in batches and react to each. Safe to run twice or concurrently."""
    notices.drain_pace()
    notices.drain_started()
    result = notices.notices_drain(paced=True)
    if result.more:
        # Hand the rest to a fresh task instead of holding this worker past its budget.
        drain_notices.delay()
    return {"processed": result.processed, "failed": result.failed, "batches": result.batches}


@shared_task(
    name="fleet.sweep_notices", acks_late=True, ignore_result=True,
    autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3,
)
def sweep_notices() -> dict:
    """Periodic: requeue stale claims and drain whatever was stored but never processed."""
    result = notices.notices_sweep()
    if result.more:
        drain_notices.delay()
    if result.processed:
        logger.info("sweep processed %d notices left behind", result.processed)
    return {"processed": result.processed, "failed": result.failed, "batches": result.batches}


@shared_task(
    name="fleet.process_notice", acks_late=True, ignore_result=True,
    autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3,
)
def process_notice(notice_id: int) -> None:
    """One notice per task: the `per_request` hand-off (the bench's baseline), not the default."""
    notices.notice_process(notice_id=notice_id)
