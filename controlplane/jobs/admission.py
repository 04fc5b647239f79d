"""Which jobs run now and which wait in their team's queue.

A team's quota (`accounts.TeamQuota`) bounds what its admitted jobs (every active status) claim at
once: `max_jobs` jobs, `max_nodes` nodes (each job claims its plan's nodes), and no job is admitted
while the team's monthly budget is spent. A job that does not fit is `queued` with the reason; the
queue is in priority order (higher first), first come first served within a priority (`queued_at`),
and strict: a job is admitted only when every job ahead of it is. `queue_admit` (every reconcile
tick) admits from the head of each team's queue while the quota has room, so a queued job starts
within one reconcile after quota frees."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.accounts.models import TeamQuota
from controlplane.common.errors import Conflict
from controlplane.fleet.locks import lock_job
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobStatus, TrainingJob

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Usage:
    """What a team's admitted jobs claim now."""

    jobs: int
    nodes: int


def job_nodes(job: TrainingJob) -> int:
    """The nodes a job claims against its team's `max_nodes`: its plan's."""
    return int((job.plan or {}).get("nodes") or 1)


def team_usage(*, team_id: int, excluding: int | None = None) -> Usage:
    """The jobs the team has admitted and the nodes their plans claim."""
    plans = TrainingJob.objects.filter(team_id=team_id, status__in=ACTIVE_JOB_STATUSES)
    if excluding is not None:
        plans = plans.exclude(pk=excluding)
    nodes = [int((plan or {}).get("nodes") or 1) for plan in plans.values_list("plan", flat=True)]
    return Usage(jobs=len(nodes), nodes=sum(nodes))


def team_quota(team_id: int) -> TeamQuota | None:
    return TeamQuota.objects.filter(team_id=team_id).first()


def admission_problem(*, job: TrainingJob, quota: TeamQuota | None, usage: Usage,
                      at: datetime | None = None) -> str | None:
    """Why `job` cannot be admitted beside `usage` under `quota` now, or None when it can."""
    if quota is None:
        return None
    if quota.max_jobs is not None and usage.jobs + 1 > quota.max_jobs:
        return f"the team's max_jobs is {quota.max_jobs} and {usage.jobs} are admitted"
    nodes = job_nodes(job)
    if quota.max_nodes is not None and usage.nodes + nodes > quota.max_nodes:
        if nodes > quota.max_nodes:
            return f"it needs {nodes} nodes, more than the team's max_nodes {quota.max_nodes}: raise the quota"
        return f"it needs {nodes} nodes; the team's max_nodes is {quota.max_nodes} and {usage.nodes} are claimed"
    if quota.monthly_budget_usd is not None:
        from controlplane.billing.metering import team_month_meter

        spent = team_month_meter(team_id=job.team_id, at=at or timezone.now()).spent_usd
        if spent >= quota.monthly_budget_usd:
            return f"the team has spent ${spent:.2f} of its ${quota.monthly_budget_usd} monthly budget"
    return None


def queue_order(queryset: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
    """Queued jobs in admission order: priority (higher first), then first come first served."""
    return queryset.filter(status=JobStatus.QUEUED).order_by("-priority", "queued_at", "id")


def queue_positions(*, team_id: int) -> dict[int, int]:
    """Each queued job of the team's position in its queue (1: next to be admitted)."""
    ids = queue_order(TrainingJob.objects.filter(team_id=team_id)).values_list("pk", flat=True)
    return {pk: position for position, pk in enumerate(ids, start=1)}


def admit_or_queue(locked: TrainingJob) -> tuple[str, str]:
    """The status a job entering the system (submitted, resumed) starts with, for a caller that holds
    its lock: (pending, "") when its team's quota has room and nobody of its team waits ahead of it,
    else (queued, why)."""
    ahead = queue_order(TrainingJob.objects.filter(team_id=locked.team_id).exclude(pk=locked.pk)).filter(
        priority__gte=locked.priority).exists()
    problem = admission_problem(job=locked, quota=team_quota(locked.team_id),
                                usage=team_usage(team_id=locked.team_id, excluding=locked.pk))
    if problem is None and ahead:
        problem = "jobs of the team queued ahead of it are admitted first"
    return (JobStatus.QUEUED, problem) if problem else (JobStatus.PENDING, "")


def queue_admit(*, team_id: int | None = None) -> list[int]:
    """Admit queued jobs (of one team, or every team) from the head of each queue while the quota
    has room; returns the jobs admitted. Safe to run concurrently: each admission locks its job, and
    a team's admissions are serialised on its quota row."""
    from controlplane.jobs.services import job_set_status

    teams = TrainingJob.objects.filter(status=JobStatus.QUEUED)
    if team_id is not None:
        teams = teams.filter(team_id=team_id)
    admitted: list[int] = []
    for team in sorted(set(teams.values_list("team_id", flat=True))):
        with transaction.atomic():
            TeamQuota.objects.select_for_update().filter(team_id=team).first()  # one admitter per team
            quota = team_quota(team)
            for job in queue_order(TrainingJob.objects.filter(team_id=team)):
                problem = admission_problem(job=job, quota=quota, usage=team_usage(team_id=team))
                if problem is not None:
                    if job.status_message != problem[:300]:
                        TrainingJob.objects.filter(pk=job.pk).update(status_message=problem[:300])
                    break  # strict order: nobody passes the head of the queue
                locked = lock_job(job)
                if locked.status != JobStatus.QUEUED:
                    continue
                job_set_status(locked, JobStatus.PENDING, "admitted: its team's quota has room", kind="admitted")
                admitted.append(locked.pk)
    if admitted:
        logger.info("admitted jobs %s", admitted)
    return admitted


QUOTA_FIELDS = ("max_nodes", "max_jobs", "monthly_budget_usd")


def team_quota_set(*, team_id: int, changes: dict[str, Any]) -> TeamQuota:
    """Set the team's quota limits named in `changes` (a limit left out stays as it was; None
    removes it). A limit below what the team's admitted jobs hold already (or, for the monthly
    budget, below this month's spend) is refused (409) and nothing is stored. Raising a limit admits
    queued jobs at once."""
    from controlplane.billing.metering import team_month_meter

    unknown = set(changes) - set(QUOTA_FIELDS)
    if unknown:
        raise ValueError(f"unknown quota fields {sorted(unknown)}")
    with transaction.atomic():
        quota, _created = TeamQuota.objects.select_for_update().get_or_create(team_id=team_id)
        usage = team_usage(team_id=team_id)
        held = {"max_nodes": (usage.nodes, "nodes the team's admitted jobs claim"),
                "max_jobs": (usage.jobs, "jobs the team has admitted")}
        for field, value in changes.items():
            if value is None:
                continue
            if field in held and value < held[field][0]:
                raise Conflict(f"{field} {value} is below the {held[field][0]} {held[field][1]}; cancel some or let "
                               "them end first", field=field)
            if field == "monthly_budget_usd":
                spent = team_month_meter(team_id=team_id, at=timezone.now()).spent_usd
                if value <= spent:
                    raise Conflict(f"monthly_budget_usd {value} is not above the ${spent:.2f} the team has spent "
                                   "this month", field=field)
            setattr(quota, field, value)
        for field, value in changes.items():
            if value is None:
                setattr(quota, field, None)
        quota.save()
    queue_admit(team_id=team_id)
    return quota


def team_quota_view(*, team_id: int) -> dict[str, Any]:
    """The team's limits and what its jobs use of them now."""
    from controlplane.billing.metering import team_month_meter

    quota = team_quota(team_id)
    usage = team_usage(team_id=team_id)
    month = team_month_meter(team_id=team_id, at=timezone.now())
    queued = list(queue_order(TrainingJob.objects.filter(team_id=team_id)).values_list("pk", "status_message"))
    return {
        "team": team_id,
        **{field: getattr(quota, field) if quota else None for field in QUOTA_FIELDS},
        "jobs_admitted": usage.jobs, "nodes_claimed": usage.nodes,
        "month_spent_usd": f"{month.spent_usd:.2f}", "month_usd_per_hour": f"{month.usd_per_hour:.4f}",
        "queue": [{"job": pk, "position": i, "reason": reason} for i, (pk, reason) in enumerate(queued, start=1)],
    }
