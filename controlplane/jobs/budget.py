"""Budget thresholds: tell a team when a job's spend crosses 50%, 80% and 100% of its budget.

Each crossing is recorded once as a JobEvent (`budget_threshold`, with the percentage), which is
both the timeline entry and what keeps a later check from alerting again. The spend is billing's
cost report; the thresholds and the events are the job's, so this is jobs' (billing knows no job)."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from controlplane.billing.reports import job_cost_report
from controlplane.fleet.locks import lock_job
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobEvent, TrainingJob
from controlplane.jobs.services import job_record_event
from controlplane.webhooks.alerts import alert_budget_threshold

THRESHOLDS_PCT = (50, 80, 100)


def job_budget_check(*, job: TrainingJob) -> list[int]:
    """Record and alert every threshold the job's spend has newly crossed; returns them."""
    if job.budget_usd is None or job.budget_usd <= 0:
        return []
    spent = job_cost_report(job=job).total
    crossed = [pct for pct in THRESHOLDS_PCT if spent >= job.budget_usd * Decimal(pct) / 100]
    if not crossed:
        return []
    with transaction.atomic():
        locked = lock_job(job)
        seen = {event.data.get("threshold_pct") for event in
                JobEvent.objects.filter(job=locked, kind="budget_threshold")}
        new = [pct for pct in crossed if pct not in seen]
        for pct in new:
            job_record_event(job=locked, kind="budget_threshold",
                             message=f"spend ${spent:.2f} crossed {pct}% of the ${locked.budget_usd} budget",
                             data={"threshold_pct": pct, "spent_usd": f"{spent:.2f}"})
            alert_budget_threshold(team_id=locked.team_id, threshold_pct=pct, spent_usd=f"{spent:.2f}",
                                   budget_usd=str(locked.budget_usd), job=locked)
    return new


def budgets_check() -> dict[int, list[int]]:
    """Check every active job with a budget (the periodic task)."""
    jobs = TrainingJob.objects.filter(status__in=ACTIVE_JOB_STATUSES, budget_usd__isnull=False)
    return {job.pk: crossed for job in jobs if (crossed := job_budget_check(job=job))}
