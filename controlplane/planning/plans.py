"""The job's plan: where its nodes come from (provider, pools, nodes, limits) and the planner's
reasoning, as one typed value stored on the job (`TrainingJob.plan`), and the parsing of a request's
`plan`. The layout the plan chose (dp x pp, micro-batches, strategy, schedule, min_stages) is stored
once, in the job's contract (`job.config`); the API shows it inside `plan` (`plan_view`).

A request's plan is either explicit (`{"dp": 2, "pp": 2, ...}`: the user chose) or `"auto"` /
`{"auto": true, ...}` (the planner chooses the cheapest plan that meets the deadline, or the fastest
within the budget, over the allowed pools). The choosing is `controlplane.planning.services.plan_job`;
this module only knows the shapes. No torch, no ORM writes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from controlplane.fleet.models import ProviderKind
from controlplane.market.local_pool import LOCAL_INSTANCE_TYPE, LOCAL_REGION, LOCAL_ZONE, LOCAL_ZONES
from controlplane.market.zones import ZONE_ID_PREFIX_TO_REGION, pool_region, region_of_zone
from controlplane.tunables import tunable
from runtime.config import LayoutError, plan_fields_problem, plan_nodes_problem

MAX_PLAN_NODES = 4096
PROFILE_PENDING = "pending"
MAX_POOLS = 64
KNOWN_REGIONS = frozenset(ZONE_ID_PREFIX_TO_REGION.values())
POOL_NAME_MAX = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPool:
    """An allowed pool: an instance type, in a zone or in any zone (""), in a region ("": the
    provider's default, or the zone's)."""

    instance_type: str
    zone: str = ""
    region: str = ""


PLAN_LAYOUT_FIELDS = ("dp", "pp", "microbatches", "strategy", "schedule", "min_stages")
"""The contract's layout fields the API shows in a job's `plan` (clients print `plan.dp x plan.pp`).
Plans stored before the layout had one home carried them too; `JobPlan.from_dict` drops them."""


@dataclass(kw_only=True, slots=True)
class JobPlan:
    """Where a job's nodes come from. `nodes` >= the contract's dp * pp (the rest are spares)."""

    provider: str
    pools: list[PlanPool]
    nodes: int
    chosen_by: str = "user"
    """`user` (explicit in the request) or `planner` (`plan: auto`)."""
    objective: str = ""
    predicted: dict[str, float] | None = None
    """The planner's prediction for the chosen plan: hours, cost_usd, step_s, samples_per_s, ..."""
    runner_ups: list[dict[str, Any]] = field(default_factory=list)
    """The next best plans the planner considered (same keys as `predicted`, plus the layout)."""
    replan: bool = False
    """`plan.auto` with `replan`: beat re-plans the job when prices or preemption rates move
    (`jobs.replanning.job_replan`)."""
    max_nodes: int = 64
    """The most nodes the planner may use (`plan.max_nodes`), kept for re-planning."""
    regions: list[str] = field(default_factory=list)
    """The regions the job may run in (`plan.regions`; empty: the provider's default). Its nodes
    stay in one region at a time."""
    profile: str = ""
    """`pending`: `plan.auto` for a model function sent without its measures; one node of the
    cheapest allowed pool measures the model first (`orchestration.services.profile`), then the
    planner plans the job from that profile. "" otherwise."""

    @property
    def awaiting_profile(self) -> bool:
        return self.profile == PROFILE_PENDING

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobPlan:
        data = {k: v for k, v in data.items() if k not in PLAN_LAYOUT_FIELDS}
        data["pools"] = [PlanPool(**p) for p in data.get("pools") or []]
        return cls(**data)


def plan_view(plan: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A stored plan as the API, the dashboard and the clients show it: the plan with the layout of
    the job's contract `config` (its one home)."""
    return {**plan, **{k: config.get(k) for k in PLAN_LAYOUT_FIELDS}}


@dataclass(kw_only=True, slots=True)
class PlanAsk:
    """A request's `plan`, checked for shape: explicit layout fields, or `auto` with its pools."""

    auto: bool
    provider: str
    instance_types: list[str]
    zones: list[str]
    regions: list[str] = field(default_factory=list)
    dp: int | None = None
    pp: int | None = None
    nodes: int | None = None
    microbatches: int | None = None
    max_nodes: int = 64
    replan: bool = False


def default_provider() -> str:
    return str(tunable("SPOTPIPE_DEFAULT_PROVIDER"))


def default_instance_types(provider: str) -> list[str]:
    """The pools a plan may use when the request names none (SPOTPIPE_AWS_INSTANCE_TYPES for aws)."""
    if provider == ProviderKind.LOCAL:
        return [LOCAL_INSTANCE_TYPE]
    return list(tunable("SPOTPIPE_AWS_INSTANCE_TYPES"))


def _int(data: dict[str, Any], name: str, *, low: int, high: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise LayoutError(f"plan.{name} must be an integer from {low} to {high}, got {value!r}", field=f"plan.{name}")
    return value


def _names(data: dict[str, Any], name: str) -> list[str]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_POOLS or not all(
        isinstance(v, str) and 0 < len(v) <= POOL_NAME_MAX and v.isprintable() for v in value
    ):
        raise LayoutError(
            f"plan.{name} must be a list of at most {MAX_POOLS} names of 1-{POOL_NAME_MAX} printable characters",
            field=f"plan.{name}",
        )
    return list(dict.fromkeys(value))


def _check_places(ask: PlanAsk) -> None:
    """Zones and regions the provider has: an unknown one is a LayoutError naming the field and the
    value (a 400), never a launch that fails later."""
    if ask.provider == ProviderKind.LOCAL:
        for name, values, known in (("zones", ask.zones, LOCAL_ZONES), ("regions", ask.regions, (LOCAL_REGION,))):
            unknown = [v for v in values if v not in known]
            if unknown:
                raise LayoutError(f"plan.{name}: {unknown[0]!r} is not a local {name[:-1]}; expected some of "
                                  f"{list(known)}", field=f"plan.{name}")
        return
    configured = list(tunable("SPOTPIPE_AWS_REGIONS"))
    for region in ask.regions:
        if region not in configured:
            raise LayoutError(f"plan.regions: {region!r} is not a region this control plane launches in; expected "
                              f"some of {configured} (SPOTPIPE_AWS_REGIONS)", field="plan.regions")
    allowed = ask.regions or configured
    for zone in ask.zones:
        region = region_of_zone(zone)
        if region not in KNOWN_REGIONS:
            raise LayoutError(f"plan.zones: {zone!r} is not an AWS zone (a zone name such as us-east-1a, or a zone "
                              "ID such as use1-az4)", field="plan.zones")
        if region not in allowed:
            raise LayoutError(f"plan.zones: {zone!r} is in {region}, not in the job's regions {allowed}",
                              field="plan.zones")


def plan_pools(ask: PlanAsk, instance_types: list[str] | None = None) -> list[PlanPool]:
    """The pools of a plan: each instance type in each allowed zone, or in any zone of each allowed
    region (zones name their region)."""
    types = instance_types if instance_types is not None else ask.instance_types
    if ask.zones:
        return [PlanPool(instance_type=t, zone=z, region=pool_region(ask.provider, z))
                for t in types for z in ask.zones]
    return [PlanPool(instance_type=t, zone="", region=r) for t in types for r in (ask.regions or [""])]


def parse_plan_request(value: Any) -> PlanAsk:
    """The request's `plan` (None = one node, dp=1 x pp=1; `"auto"`; or an object). Raises
    `LayoutError` naming `plan.<field>`."""
    if value is None:
        value = {"dp": 1, "pp": 1}
    if value == "auto":
        value = {"auto": True}
    if not isinstance(value, dict):
        raise LayoutError(f"plan must be \"auto\" or an object, got {value!r}"[:200], field="plan")
    if problem := plan_fields_problem(value):
        raise problem
    auto, replan = value.get("auto", False), value.get("replan", False)
    for name, flag in (("auto", auto), ("replan", replan)):
        if not isinstance(flag, bool):
            raise LayoutError(f"plan.{name} must be true or false, got {flag!r}", field=f"plan.{name}")
    if replan and not auto:
        raise LayoutError("plan.replan needs plan.auto: only the planner's plans are re-planned", field="plan.replan")
    provider = value.get("provider") or default_provider()
    if provider not in ProviderKind.values:
        raise LayoutError(f"plan.provider {provider!r} is unknown; expected one of {ProviderKind.values}",
                          field="plan.provider")
    ask = PlanAsk(
        auto=auto, provider=provider,
        instance_types=_names(value, "instance_types") or default_instance_types(provider),
        zones=_names(value, "zones") or ([LOCAL_ZONE] if provider == ProviderKind.LOCAL else []),
        regions=_names(value, "regions"),
        dp=_int(value, "dp", low=1, high=MAX_PLAN_NODES), pp=_int(value, "pp", low=1, high=MAX_PLAN_NODES),
        nodes=_int(value, "nodes", low=1, high=MAX_PLAN_NODES),
        microbatches=_int(value, "microbatches", low=1, high=MAX_PLAN_NODES),
        max_nodes=_int(value, "max_nodes", low=1, high=MAX_PLAN_NODES) or 64, replan=replan,
    )
    _check_places(ask)
    if auto:
        chosen = [n for n in ("dp", "pp", "nodes", "microbatches") if getattr(ask, n) is not None]
        if chosen:
            raise LayoutError(f"plan.{chosen[0]} is chosen by the planner with plan.auto; give one or the other",
                              field=f"plan.{chosen[0]}")
    else:
        ask.dp = ask.dp or 1
        ask.pp = ask.pp or 1
        if ask.nodes is not None and (problem := plan_nodes_problem(ask.nodes, dp=ask.dp, pp=ask.pp)):
            raise problem
        if ask.dp * ask.pp > MAX_PLAN_NODES:
            raise LayoutError(f"dp x pp = {ask.dp * ask.pp} is over {MAX_PLAN_NODES} nodes", field="plan.dp")
    return ask
