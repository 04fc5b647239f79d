"""Which jobs run now and which wait in their team's queue.

A team's quota (`accounts.TeamQuota`) bounds what its admitted jobs (every active status) claim at
once: `max_jobs` jobs, `max_nodes` nodes (each job claims its plan's nodes), and no job is admitted
while the team's monthly budget is spent. A job that does not fit is `queued` with the reason; the
queue is in priority order (higher first), first come first served within a priority (`queued_at`),
and strict: a job is admitted only when every job ahead of it is. `queue_admit` (every reconcile
tick) admits from the head of each team's queue while the quota has room, so a queued job starts
within one reconcile after quota frees.

The account's own limit (`SPOTPIPE_ACCOUNT_MAX_VCPUS`, the provider's vCPU quota; 0: none) is
shared between the teams that want capacity (admitted or queued jobs) by fair share: each team's
share is the limit over their number. A team may borrow beyond its share while the account has room
(Kueue's cohorts); when a team whose queue head fits in its own share is held back by the account
limit, the teams over their share give back: their lowest-priority, most recently admitted jobs are
stopped with a checkpoint and put back in their queue (`job_stop`, `requeue`), until the freed
vCPUs cover the ask."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.accounts.models import TeamQuota
from controlplane.billing.metering import team_month_meter
from controlplane.common.errors import Conflict
from controlplane.fleet.locks import lock_job
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobStatus, TrainingJob
from controlplane.market.models import InstanceType
from controlplane.tunables import tunable

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


def account_vcpu_limit() -> int:
    return int(tunable("SPOTPIPE_ACCOUNT_MAX_VCPUS"))


def job_vcpus(job: TrainingJob, *, vcpus_of: dict[str, int] | None = None) -> int:
    """The vCPUs a job claims against the account's limit: its plan's nodes times the largest vCPU
    count among its plan's instance types (the acquisition may buy any of them); 1 a node when the
    catalogue does not say (local nodes)."""
    types = {p.get("instance_type") for p in (job.plan or {}).get("pools") or [] if p.get("instance_type")}
    if vcpus_of is None:
        vcpus_of = dict(InstanceType.objects.filter(name__in=types).values_list("name", "vcpus"))
    per_node = max([vcpus_of.get(t) or 0 for t in types] or [0]) or 1
    return job_nodes(job) * per_node


def account_usage() -> dict[int, int]:
    """vCPUs each team's admitted jobs claim (stopping ones included: they hold nodes until stopped)."""
    jobs = list(TrainingJob.objects.filter(status__in=ACTIVE_JOB_STATUSES).only("pk", "team_id", "plan"))
    names = {p.get("instance_type") for j in jobs for p in (j.plan or {}).get("pools") or []}
    vcpus_of = dict(InstanceType.objects.filter(name__in=names).values_list("name", "vcpus"))
    usage: dict[int, int] = {}
    for job in jobs:
        usage[job.team_id] = usage.get(job.team_id, 0) + job_vcpus(job, vcpus_of=vcpus_of)
    return usage


def _others_wait_below_share(team_id: int, account: dict[int, int], share: float) -> bool:
    waiting = set(TrainingJob.objects.filter(status=JobStatus.QUEUED).exclude(team_id=team_id)
                  .values_list("team_id", flat=True))
    return any(account.get(team, 0) < share for team in waiting)


def fair_share(limit: int) -> float:
    """Each team's share of the account's limit: the limit over the teams that want capacity."""
    wanting = set(TrainingJob.objects.filter(status__in={*ACTIVE_JOB_STATUSES, JobStatus.QUEUED})
                  .values_list("team_id", flat=True))
    return limit / max(1, len(wanting))


def admission_problem(*, job: TrainingJob, quota: TeamQuota | None, usage: Usage,
                      at: datetime | None = None, account: dict[int, int] | None = None) -> str | None:
    """Why `job` cannot be admitted beside `usage` under `quota` (and the account's limit, with
    `account`: vCPUs per team) now, or None when it can."""
    limit = account_vcpu_limit()
    if limit and account is not None:
        used, need, ours = sum(account.values()), job_vcpus(job), account.get(job.team_id, 0)
        if used + need > limit:
            return (f"the account's {limit} vCPUs are in use ({ours} by this team, {used - ours} by others); it "
                    f"needs {need}")
        share = fair_share(limit)
        if ours + need > share and _others_wait_below_share(job.team_id, account, share):
            return (f"the team would pass its fair share ({share:.0f} of the account's {limit} vCPUs) while "
                    "another team below its share waits")
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
    account = _without(account_usage(), locked) if account_vcpu_limit() else None
    problem = admission_problem(job=locked, quota=team_quota(locked.team_id),
                                usage=team_usage(team_id=locked.team_id, excluding=locked.pk), account=account)
    if problem is None and ahead:
        problem = "jobs of the team queued ahead of it are admitted first"
    return (JobStatus.QUEUED, problem) if problem else (JobStatus.PENDING, "")


def _without(account: dict[int, int], job: TrainingJob) -> dict[int, int]:
    """The account's usage without `job`'s own claim (a job being admitted is counted once)."""
    if job.status not in ACTIVE_JOB_STATUSES:
        return account
    return {**account, job.team_id: max(0, account.get(job.team_id, 0) - job_vcpus(job))}


GiveBack = Callable[[TrainingJob, str], bool]
"""Ask an active job to checkpoint and go back to its queue with a message; False when it cannot
(it is stopping already). Orchestration's (`orchestration.services.job_stop.give_back_quota`):
stopping a job's nodes is not this module's to do."""


def _reclaim(job: TrainingJob, account: dict[int, int], give_back: GiveBack) -> list[int]:
    """`job` fits in its team's fair share but not in the account: ask the teams over their share to
    give back (their lowest-priority, newest jobs stop with a checkpoint and go back to their queue)
    until what is being freed covers the ask. Returns the jobs asked to give back."""
    limit = account_vcpu_limit()
    share = fair_share(limit)
    need = job_vcpus(job)
    if account.get(job.team_id, 0) + need > share:
        return []  # beyond its own share it waits like anyone
    short = sum(account.values()) + need - limit
    freeing = sum(job_vcpus(j) for j in TrainingJob.objects.filter(status=JobStatus.STOPPING,
                                                                    stop_requested_at__isnull=False,
                                                                    end_reason=""))
    asked: list[int] = []
    over = {team for team, used in account.items() if used > share and team != job.team_id}
    candidates = (TrainingJob.objects.filter(team_id__in=over, status__in=ACTIVE_JOB_STATUSES)
                  .exclude(status=JobStatus.STOPPING).order_by("priority", "-created_at", "-id"))
    for borrower in candidates:
        if freeing >= short:
            break
        if account[borrower.team_id] <= share:
            continue  # this team has given back enough
        if give_back(borrower, f"giving back borrowed quota: team {job.team_id}'s job {job.pk} asks for its "
                               f"fair share ({share:.0f} of the account's {limit} vCPUs)"):
            freed = job_vcpus(borrower)
            freeing += freed
            account[borrower.team_id] -= freed
            asked.append(borrower.pk)
    return asked


def queue_admit(*, team_id: int | None = None, give_back: GiveBack | None = None) -> list[int]:
    """Admit queued jobs (of one team, or every team) from the head of each queue while the quota
    has room; returns the jobs admitted. With `give_back` (the reconcile tick's), a queue head held
    back by the account's limit alone asks the borrowing teams to give back (`_reclaim`); without it
    (a quota change) that waits for the next tick. Safe to run concurrently: each admission locks its
    job, and a team's admissions are serialised on its quota row."""
    from controlplane.jobs.services import job_set_status

    teams = TrainingJob.objects.filter(status=JobStatus.QUEUED)
    if team_id is not None:
        teams = teams.filter(team_id=team_id)
    admitted: list[int] = []
    usage = account_usage() if account_vcpu_limit() else {}
    # The teams using least of the account first: with a shared limit, the fair share goes to them.
    for team in sorted(set(teams.values_list("team_id", flat=True)), key=lambda t: (usage.get(t, 0), t)):
        with transaction.atomic():
            TeamQuota.objects.select_for_update().filter(team_id=team).first()  # one admitter per team
            quota = team_quota(team)
            for job in queue_order(TrainingJob.objects.filter(team_id=team)):
                account = account_usage() if account_vcpu_limit() else None
                problem = admission_problem(job=job, quota=quota, usage=team_usage(team_id=team), account=account)
                if problem is not None:
                    if job.status_message != problem[:300]:
                        TrainingJob.objects.filter(pk=job.pk).update(status_message=problem[:300])
                    if give_back is not None and account is not None and admission_problem(
                            job=job, quota=quota, usage=team_usage(team_id=team)) is None:
                        _reclaim(job, account, give_back)  # held back by the account's limit alone
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
