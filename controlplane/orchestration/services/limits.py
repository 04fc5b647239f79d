"""The limits that stop a job (each reconcile asks them, so at least every few seconds): its budget
and its team's monthly budget (spend metered from the billing ledger, `billing.metering`),
`max_runtime_s` and `max_wait_s`. Each asks the job to checkpoint and stop (`job_stop`) with its
`end_reason`. A budget stops the job while `SPOTPIPE_BUDGET_STOP_MARGIN_S` of its fleet's spend is
still left, which is what the checkpoint and the release spend: the cap is not overshot by more than
the stop's own tail. (The third limit, `max_restarts_on_errors`, is counted where crashes are
reported: `job_end.worker_exit_report`.)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from controlplane.accounts.models import TeamQuota
from controlplane.billing.metering import Meter, job_meter, team_month_meter
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, EndReason, JobGeneration, JobStatus, TrainingJob
from controlplane.orchestration.services.job_end import run_started_at
from controlplane.orchestration.services.job_stop import job_request_stop
from controlplane.orchestration.services.region_move import waiting_since
from controlplane.orchestration.services.transitions import _now
from controlplane.tunables import tunable


@dataclass(frozen=True, slots=True)
class Breach:
    """A limit the job reached: its end reason, what to tell the team, and the figures."""

    end_reason: str
    message: str
    data: dict


def budget_stop_margin_s() -> float:
    return float(tunable("SPOTPIPE_BUDGET_STOP_MARGIN_S"))


def _budget_breach(meter: Meter, cap: Decimal, *, whose: str) -> Breach | None:
    margin = budget_stop_margin_s()
    if meter.projected(margin) < cap:
        return None
    return Breach(EndReason.BUDGET, (
        f"{whose} ${cap}: spent ${meter.spent_usd:.2f}, ${meter.usd_per_hour:.2f}/h now, "
        f"{margin:.0f} s left at most"), {
        "spent_usd": f"{meter.spent_usd:.4f}", "usd_per_hour": f"{meter.usd_per_hour:.4f}", "cap_usd": str(cap),
        "budget_of": "team_month" if whose.startswith("the team") else "job", "margin_s": margin})


def training_started_at(job: TrainingJob) -> datetime | None:
    """When the job's current run first trained: its first generation since it was submitted or
    resumed (queued and provisioning time do not count as runtime)."""
    since = run_started_at(job)
    generations = JobGeneration.objects.filter(job=job)
    if since is not None:
        generations = generations.filter(created_at__gte=since)
    return generations.order_by("created_at").values_list("created_at", flat=True).first()


def job_limit_breach(*, job: TrainingJob, now: datetime | None = None) -> Breach | None:
    """The first limit the active job has reached now, or None."""
    now = now or _now()
    if job.budget_usd is not None:
        breach = _budget_breach(job_meter(job_id=job.pk, at=now), job.budget_usd, whose="its budget of")
        if breach is not None:
            return breach
    monthly = (TeamQuota.objects.filter(team_id=job.team_id, monthly_budget_usd__isnull=False)
               .values_list("monthly_budget_usd", flat=True).first())
    if monthly is not None:
        breach = _budget_breach(team_month_meter(team_id=job.team_id, at=now), monthly,
                                whose="the team's monthly budget of")
        if breach is not None:
            return breach
    if job.max_runtime_s is not None:
        began = training_started_at(job)
        if began is not None and (ran := (now - began).total_seconds()) >= job.max_runtime_s:
            return Breach(EndReason.MAX_RUNTIME, f"it has run {ran:.0f} s, its max_runtime_s is {job.max_runtime_s}",
                          {"ran_s": round(ran, 1), "max_runtime_s": job.max_runtime_s})
    if job.max_wait_s is not None:
        since = waiting_since(job)
        if since is not None and (waited := (now - since).total_seconds()) >= job.max_wait_s:
            return Breach(EndReason.MAX_WAIT, f"it has waited {waited:.0f} s for capacity, its max_wait_s is "
                          f"{job.max_wait_s}", {"waited_s": round(waited, 1), "max_wait_s": job.max_wait_s})
    return None


def job_limits_review(*, job: TrainingJob, now: datetime | None = None) -> str | None:
    """Ask the job to stop when it reached a limit; returns the end reason it stops with."""
    if job.status not in ACTIVE_JOB_STATUSES or job.status == JobStatus.STOPPING:
        return None
    breach = job_limit_breach(job=job, now=now)
    if breach is None:
        return None
    if not job_request_stop(job=job, end_reason=breach.end_reason, message=f"limit reached, {breach.message}",
                            data=breach.data, now=now):
        return None
    return breach.end_reason
