"""Celery tasks of the jobs app."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from controlplane.jobs.budget import budgets_check
from controlplane.jobs.replanning import replan_due_jobs
from controlplane.jobs.tracking import forward_open_trackers


@shared_task(name="jobs.forward_tracking", ignore_result=True)
def forward_tracking() -> int:
    """Forward new metrics of jobs with `tracking` to their experiment trackers (beat, every
    SPOTPIPE_TRACKING_PERIOD_S)."""
    return forward_open_trackers()


# The name is its wire identity (beat's schedule carries it), kept from when planning held it.
@shared_task(name="planning.replan_jobs")
def replan_jobs() -> list[int]:
    """Re-plan the jobs that allow it with today's prices and preemption rates."""
    return replan_due_jobs()


# The name is its wire identity (beat's schedule carries it), kept from when billing held it.
@shared_task(name="billing.check_budgets", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=3)
def check_budgets() -> int:
    """Alert on budget thresholds newly crossed; safe to run twice (crossings are recorded once)."""
    return len(budgets_check())
