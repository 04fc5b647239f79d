"""Celery tasks of the observability app: thin wrappers over its services."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from controlplane.observability.rollup import metrics_rollup_refresh


@shared_task(name="observability.refresh_metrics_rollup", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=5, max_retries=3)
def refresh_metrics_rollup() -> dict[str, int]:
    """Fold the rows written since the previous run into the metrics roll-up. Safe to run twice
    or concurrently: each row is folded once."""
    return metrics_rollup_refresh()
