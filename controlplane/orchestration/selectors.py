"""Reads of the orchestration app: the capacity a job wants, the pools to take it from, and what an
agent should run now."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

from django.db.models import OuterRef, QuerySet, Subquery

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobGeneration, TrainingJob
from controlplane.market.models import InstanceType, SpotPrice
from controlplane.market.zones import pool_region
from controlplane.orchestration.offerings import pool_unavailability
from controlplane.orchestration.providers.base import Pool
from controlplane.planning.plans import JobPlan
from runtime.planner.capacity_policy import ON_DEMAND, SPOT

# Instances that count towards a job's capacity (a node under notice is already leaving).
COUNTED_STATES = frozenset({InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING})


@dataclass(frozen=True, slots=True)
class RankedPools:
    """A job's pools for one launch, cheapest first, split by what `offerings` says of them now."""

    usable: list[Pool]
    """What to ask, in this order."""
    cooling: list[Pool]
    """Left out: they preempted the team lately (asked anyway when nothing else is left)."""
    unavailable: list[Pool]
    """Left out: they answered "no capacity" to some team within the TTL (never asked)."""


def _spot_prices(names: list[str]) -> dict[str, Decimal]:
    """The spot price in force of every pool (`type@zone`) of these instance types."""
    latest = SpotPrice.objects.filter(
        instance_type__name=OuterRef("instance_type__name"), zone__code=OuterRef("zone__code")
    ).order_by("-timestamp")
    prices: dict[str, Decimal] = {}
    for row in (
        SpotPrice.objects.filter(instance_type__name__in=names)
        .annotate(latest_id=Subquery(latest.values("id")[:1]))
        .values("id", "latest_id", "instance_type__name", "zone__code", "price")
    ):
        if row["id"] == row["latest_id"]:
            prices[f"{row['instance_type__name']}@{row['zone__code']}"] = row["price"]
    return prices


def _on_demand_prices(provider: str, names: list[str]) -> dict[str, Decimal]:
    rows = InstanceType.objects.filter(cloud__code=provider, name__in=names, on_demand_price__isnull=False)
    return dict(rows.values_list("name", "on_demand_price"))


def pools_ranked(*, job: TrainingJob, plan: JobPlan | None = None, capacity_type: str = SPOT,
                 region: str | None = None, now=None) -> RankedPools:
    """The plan's pools for a launch of `capacity_type` (in `region` only, when given), cheapest
    first by the price in force (spot price, or the type's on-demand price), without the offerings
    `offerings` marks unavailable. If every pool left is cooling down after a preemption, those are
    used; an offering without capacity is never used before its mark expires."""
    plan = plan or JobPlan.from_dict(job.plan)
    pools = [Pool(instance_type=p.instance_type, zone=p.zone, region=p.region) for p in plan.pools
             if region is None or pool_region(plan.provider, p.zone, p.region) == region]
    names = [p.instance_type for p in pools]
    if capacity_type == ON_DEMAND:
        by_type = _on_demand_prices(plan.provider, names)
        priced = [replace(p, price=by_type.get(p.instance_type)) for p in pools]
    else:
        prices = _spot_prices(names)
        priced = [replace(p, price=prices.get(p.key)) for p in pools]
    priced.sort(key=lambda p: (p.price is None, p.price or Decimal(0)))
    state = pool_unavailability(team_id=job.team_id, provider=plan.provider, capacity_type=capacity_type, now=now)
    unavailable = [p for p in priced if state.blocked(p)]
    open_pools = [p for p in priced if not state.blocked(p)]
    usable = [p for p in open_pools if p.key not in state.cooling]
    cooling = [p for p in open_pools if p.key in state.cooling]
    if not usable:
        return RankedPools(usable=cooling, cooling=[], unavailable=unavailable)
    return RankedPools(usable=usable, cooling=cooling, unavailable=unavailable)


def _counted(job: TrainingJob, lifecycle: str | None = None) -> QuerySet[Instance]:
    rows = Instance.objects.filter(job=job, state__in=COUNTED_STATES)
    return rows.filter(lifecycle=lifecycle) if lifecycle else rows


def job_counted_instances(*, job: TrainingJob) -> list[Instance]:
    return list(_counted(job).order_by("id"))


def job_counted_count(*, job: TrainingJob, lifecycle: str | None = None) -> int:
    """How many of the job's instances count toward its plan (`COUNTED_STATES`), without loading
    them: a reconcile asks under the job's lock, and loading 1,024 rows to count them held it
    about 76 ms (`python -m bench joblocks`, profiled)."""
    return _counted(job, lifecycle).count()


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
    (the one formula: the poll's batched first step, `controlplane/hotpaths/poll_channel.py`, uses it too)."""
    return f"{state}:{job_id}:{generation}:{status}"


def instance_command_version(*, instance: Instance) -> str:
    """`agent_command_version` of rows already read (with `instance.job`): an answer must carry the
    version of the very rows it was built from, or an agent that got an answer built before a new
    generation but versioned after it would hold its long-poll on that version forever."""
    job = instance.job
    return command_version(instance.state, instance.job_id, job.current_generation if job else None,
                    job.status if job else None)
