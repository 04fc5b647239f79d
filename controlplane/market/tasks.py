"""Celery tasks of the market (thin: the work is in `market.rollup`). The periodic pull of spot
prices is billing's task (`billing.tasks.pull_spot_prices`): new prices re-price the open segments."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from controlplane.market.rollup import price_rollup_refresh


@shared_task(name="market.refresh_price_rollup", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=5, max_retries=3)
def refresh_price_rollup() -> int:
    """Fold new spot prices into the hourly roll-up, so the first long-range chart after a big
    price load does not pay for it. Safe to run twice: each price row is folded once."""
    return price_rollup_refresh()
