"""Celery tasks of the planning app (thin: the work is in services)."""

from __future__ import annotations

from celery import shared_task

from controlplane.planning.services import replan_due_jobs


@shared_task(name="planning.replan_jobs")
def replan_jobs() -> list[int]:
    """Re-plan the jobs that allow it with today's prices and preemption rates."""
    return replan_due_jobs()
