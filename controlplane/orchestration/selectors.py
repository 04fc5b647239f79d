"""Reads of the orchestration app: the capacity a job wants, the pools to take it from, and what an
agent should run now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobGeneration, TrainingJob
from controlplane.market.models import SpotPrice
from controlplane.orchestration.providers.base import Pool

# Instances that count towards a job's capacity (a node under notice is already leaving).
COUNTED_STATES = frozenset({InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING})
# A pool that preempted one of the team's nodes this recently is not asked again (Karpenter's
# "unavailable offerings" cache does the same, for 3 minutes).
POOL_COOLDOWN = timedelta(minutes=3)


@dataclass(frozen=True, slots=True)
class JobShape:
    """What the job's plan (`controlplane.jobs.plans.JobPlan`) asks for, as orchestration uses it."""

    dp: int
    pp: int
    nodes: int
    provider: str
    pools: tuple[Pool, ...]
    strategy: str
    min_stages: int


def job_shape(*, job: TrainingJob) -> JobShape:
    from controlplane.jobs.plans import JobPlan

    plan = JobPlan.from_dict(job.plan)
    return JobShape(
        dp=plan.dp, pp=plan.pp, nodes=plan.nodes, provider=plan.provider,
        pools=tuple(Pool(instance_type=p.instance_type, zone=p.zone) for p in plan.pools),
        strategy=plan.strategy, min_stages=plan.min_stages,
    )


def recently_preempted_pools(*, team_id: int, now=None) -> set[str]:
    """Pool keys (`type@zone`) where one of the team's nodes was preempted or got a notice lately."""
    since = (now or timezone.now()) - POOL_COOLDOWN
    rows = Instance.objects.filter(
        Q(notice_at__gte=since) | Q(state=InstanceState.PREEMPTED, ended_at__gte=since), team_id=team_id
    ).values_list("instance_type__name", "zone__code")
    return {f"{itype}@{zone or '*'}" for itype, zone in rows}


def pools_ranked(*, job: TrainingJob, shape: JobShape | None = None) -> tuple[list[Pool], list[Pool]]:
    """The plan's pools, cheapest first by the spot price in force, with the pools that just
    preempted us left out (returned second). If every pool is cooling down, all are used."""
    shape = shape or job_shape(job=job)
    latest = SpotPrice.objects.filter(
        instance_type__name=OuterRef("instance_type__name"), zone__code=OuterRef("zone__code")
    ).order_by("-timestamp")
    prices: dict[str, Decimal] = {}
    names = [p.instance_type for p in shape.pools]
    for row in (
        SpotPrice.objects.filter(instance_type__name__in=names)
        .annotate(latest_id=Subquery(latest.values("id")[:1]))
        .values("id", "latest_id", "instance_type__name", "zone__code", "price")
    ):
        if row["id"] == row["latest_id"]:
            prices[f"{row['instance_type__name']}@{row['zone__code']}"] = row["price"]
    priced = [Pool(instance_type=p.instance_type, zone=p.zone, price=prices.get(p.key)) for p in shape.pools]
    priced.sort(key=lambda p: (p.price is None, p.price or Decimal(0)))
    cooling = recently_preempted_pools(team_id=job.team_id)
    usable = [p for p in priced if p.key not in cooling]
    avoided = [p for p in priced if p.key in cooling]
    return (usable or priced), (avoided if usable else [])


def _counted(job: TrainingJob) -> QuerySet[Instance]:
    return Instance.objects.filter(job=job, state__in=COUNTED_STATES)


def job_counted_instances(*, job: TrainingJob) -> list[Instance]:
    return list(_counted(job).order_by("id"))


def job_counted_count(*, job: TrainingJob) -> int:
    """How many of the job's instances count toward its plan (`COUNTED_STATES`), without loading
    them: a reconcile asks under the job's lock, and loading 1,024 rows to count them held it
    about 76 ms (`python -m bench joblocks`, profiled)."""
    return _counted(job).count()


def job_current_generation(*, job: TrainingJob) -> JobGeneration | None:
    if not job.current_generation:
        return None
    return JobGeneration.objects.filter(job_id=job.pk, number=job.current_generation).first()


def agent_command_version(*, instance_id: int) -> tuple[str, int | None]:
    """A cheap fingerprint of what the agent of `instance_id` should run (one indexed query), and
    the job id: the long-poll compares it with the agent's last one."""
    row = (
        Instance.objects.filter(pk=instance_id)
        .values_list("state", "job_id", "job__current_generation", "job__status")
        .first()
    )
    if row is None:
        return "gone", None
    return command_version(*row), row[1]


def agent_command_versions(instance_ids: list[int]) -> dict[int, str]:
    """`agent_command_version` of many instances in one query (the agent channel's poll of every
    held long-poll of a web worker); an unknown id is left out (its version is `gone`)."""
    rows = Instance.objects.filter(pk__in=instance_ids).values_list(
        "pk", "state", "job_id", "job__current_generation", "job__status")
    return {pk: command_version(*rest) for pk, *rest in rows}


def command_version(state: str, job_id: int | None, generation: int | None, status: str | None) -> str:
    """The version of an instance's command from its state and its job's id, generation and status
    (the one formula: the poll's batched first step, `controlplane/orchestration/poll_channel.py`, uses it too)."""
    return f"{state}:{job_id}:{generation}:{status}"


def instance_command_version(*, instance: Instance) -> str:
    """`agent_command_version` of rows already read (with `instance.job`): an answer must carry the
    version of the very rows it was built from, or an agent that got an answer built before a new
    generation but versioned after it would hold its long-poll on that version forever."""
    job = instance.job
    return command_version(instance.state, instance.job_id, job.current_generation if job else None,
                    job.status if job else None)
