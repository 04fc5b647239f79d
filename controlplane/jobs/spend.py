"""What a job has spent, spends now, and is projected to spend: billing's meter of the job's
segments with the job's own step time and steps left (the API's and the job page's `spend`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from controlplane.billing.metering import job_meter
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.selectors import job_measured_step_s


@dataclass(frozen=True, slots=True)
class JobSpend:
    """What a job has spent, spends now, and is projected to have spent when its steps are done."""

    spent_usd: Decimal
    usd_per_hour: Decimal
    projected_usd: Decimal | None
    """Spent plus the steps left at the measured (else predicted) step time and today's fleet rate
    (the plan's nodes at today's price when none runs now); None without a step time."""


def job_spend(*, job: TrainingJob, at: datetime) -> JobSpend:
    """The job's spend to `at`, its fleet's rate then, and its projected spend at completion."""
    now = job_meter(job_id=job.pk, at=at)
    step_s = job_measured_step_s(job) or ((job.plan or {}).get("predicted") or {}).get("step_s")
    projected = None
    if isinstance(step_s, int | float) and step_s > 0:
        left_s = max(0, job.target_steps - job.steps_done) * float(step_s)
        projected = now.projected(left_s) if now.usd_per_hour > 0 else now.spent_usd + Decimal(str(
            ((job.plan or {}).get("predicted") or {}).get("cost_usd") or 0)) * Decimal(
            max(0, job.target_steps - job.steps_done)) / Decimal(max(job.target_steps, 1))
    return JobSpend(spent_usd=now.spent_usd, usd_per_hour=now.usd_per_hour, projected_usd=projected)
