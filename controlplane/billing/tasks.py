"""Billing's periodic work (thin wrappers over services)."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from controlplane.billing.budget import budgets_check


@shared_task(name="billing.check_budgets", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=3)
def check_budgets() -> int:
    """Alert on budget thresholds newly crossed; safe to run twice (crossings are recorded once)."""
    return len(budgets_check())
