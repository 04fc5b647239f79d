"""Planning a job: turn an API or command request into a `runtime.planner` request, price it with
the market's pools, and return the plan (or a `PlanInfeasible` with the nearest feasible plan)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.utils import timezone

from controlplane.common.errors import DomainError
from controlplane.fleet.models import ProviderKind
from controlplane.market.local_pool import LOCAL_INSTANCE_TYPE, LOCAL_REGION, LOCAL_STAND_IN_TYPE
from controlplane.market.zones import region_of_zone
from controlplane.planning.plans import PROFILE_PENDING, JobPlan, PlanAsk, PlanPool, plan_pools
from controlplane.planning.selectors import pools_for_plan
from controlplane.tunables import tunable
from runtime.config import (
    AUTO_STRATEGY,
    SCHEDULES,
    USER_MODEL_KIND,
    DeviceTime,
    JobConfig,
    LayoutError,
    LayoutErrors,
    ModelSpec,
    build_job_config,
    each_error,
    explicit_layout,
    resolve_strategy,
)
from runtime.planner.capacity_policy import DEFAULT_CAPACITY_POLICY
from runtime.planner.catalog import InstanceSpec
from runtime.planner.catalog import instance_types as shipped_types
from runtime.planner.predictor import default_predictor
from runtime.planner.profile import DeviceSpec, ModelProfile, ProfileStore
from runtime.planner.search import Candidate, Plan, PlanError, Planner, PlanRequest, default_microbatch_size
from runtime.planner.search import Pool as PricedPool
from runtime.strategies.links import stated_by_cost_models

_PLANNER: Planner | None = None


def _planner() -> Planner:
    """One planner per process: it caches predicted profiles and replays across requests. Measured
    profiles stored under $SPOTPIPE_PROFILE_DIR (default var/profiles; `python -m runtime.planner
    profile` writes them) win over predictions and train the predictor."""
    global _PLANNER
    if _PLANNER is None:
        root = Path(tunable("SPOTPIPE_PROFILE_DIR"))
        _PLANNER = Planner(store=ProfileStore(root) if root.is_dir() else None)
    return _PLANNER


class PlanInfeasible(DomainError):
    """A valid request no plan can satisfy; carries the nearest feasible plan when there is one."""

    status_code = 422

    def __init__(self, message: str, *, field: str, nearest: Candidate | None) -> None:
        super().__init__(message, field=field)
        self.nearest = nearest


@dataclass(frozen=True, slots=True)
class PlanInput:
    model: ModelSpec
    global_batch: int
    samples: int
    instance_types: list[str]
    zones: list[str] | None = None
    deadline_hours: float | None = None
    budget_usd: float | None = None
    strategy: str = AUTO_STRATEGY
    max_nodes: int = 32
    microbatch_size: int = 0


def plan_compute(*, data: PlanInput, team_ids: Iterable[int] | None, at: datetime | None = None) -> tuple[Plan, list]:
    """Plan `data` against the pools of its allowed types. Raises `DomainError` (400) naming the
    field for bad input and `PlanInfeasible` (422) with the nearest plan when nothing satisfies it."""
    at = at or timezone.now()
    known = shipped_types()
    unknown = [t for t in data.instance_types if t not in known]
    if unknown:
        raise DomainError(
            f"instance type(s) {unknown} have no profile or datasheet; known: {sorted(known)}", field="instance_types"
        )
    pools = pools_for_plan(
        instance_types=data.instance_types, zones=data.zones, at=at, team_ids=team_ids, max_nodes=data.max_nodes
    )
    request = PlanRequest(
        model=data.model,
        global_batch=data.global_batch,
        samples=data.samples,
        pools=pools,
        deadline_hours=data.deadline_hours,
        budget_usd=data.budget_usd,
        strategy=data.strategy,
        microbatch_size=data.microbatch_size,
    )
    try:
        return _planner().plan(request), pools
    except PlanError as exc:
        if exc.field in ("deadline_hours", "budget_usd") or (exc.field == "pools" and exc.nearest is None and pools):
            raise PlanInfeasible(exc.message, field=exc.field, nearest=exc.nearest) from exc
        raise DomainError(exc.message, field=exc.field) from exc


# --- The plan of a job -------------------------------------------------------------------------------

PLAN_ERROR_FIELDS = {"deadline_hours": "deadline", "budget_usd": "budget_usd", "pools": "plan.instance_types",
                     "microbatch_size": "model_spec.micro_batches", "model": "config.model"}
"""The planner's input names -> the job request's fields, for 400s that name what the user sent."""
RUNNER_UPS = 3
LOCAL_NODE_MEMORY_GIB = 4.0
"""What the planner lets one local node (a process on this host) hold."""


def known_instance_types(provider: str) -> set[str]:
    """Instance types a plan on `provider` may name."""
    if provider == ProviderKind.LOCAL:
        return {LOCAL_INSTANCE_TYPE}
    return set(shipped_types())


def _check_pools(ask: PlanAsk) -> None:
    known = known_instance_types(ask.provider)
    unknown = [t for t in ask.instance_types if t not in known]
    if unknown:
        raise LayoutError(
            f"instance type(s) {unknown} are unknown on provider {ask.provider!r}; expected some of {sorted(known)}",
            field="plan.instance_types",
        )


def _local_planner(config: JobConfig, microbatch_size: int) -> Planner:
    """A planner that knows the local node: its profile is the job's emulated device time per layer
    (what every local worker pads each action to, so the plan's step is the step that runs), with
    the model's bytes and FLOPs from the shared predictor."""
    device_time = config.device_time or DeviceTime()
    device = DeviceSpec(name=LOCAL_INSTANCE_TYPE, peak_tflops=1.0, memory_bandwidth_gbs=10.0, network_gbps=10.0)
    predicted = default_predictor().predict(config.model, microbatch_size=microbatch_size, device=device,
                                            instance_type=LOCAL_INSTANCE_TYPE)
    for layer in predicted.layers:
        layer.forward_s = device_time.forward_ms / 1000
        layer.backward_input_s = device_time.backward_input_ms / 1000
        layer.backward_weight_s = device_time.backward_weight_ms / 1000
    profile = ModelProfile(instance_type=LOCAL_INSTANCE_TYPE, device=device, model=predicted.model,
                           microbatch_size=microbatch_size, layers=predicted.layers, measured=True,
                           meta={"source": "the job's emulated device time"})
    stand_in = shipped_types()[LOCAL_STAND_IN_TYPE]
    catalog = {LOCAL_INSTANCE_TYPE: InstanceSpec(
        name=LOCAL_INSTANCE_TYPE, accelerator="cpu (emulated device time)", accelerators=1,
        device_memory_gib=LOCAL_NODE_MEMORY_GIB, peak_tflops=device.peak_tflops,
        memory_bandwidth_gbs=device.memory_bandwidth_gbs, network_gbps=device.network_gbps,
        on_demand_usd_per_hour=stand_in.on_demand_usd_per_hour,
    )}
    return Planner(profiles={LOCAL_INSTANCE_TYPE: profile}, catalog=catalog)


def _priced_pools(ask: PlanAsk, *, team_id: int, at: datetime) -> list[PricedPool]:
    pools = pools_for_plan(instance_types=ask.instance_types, zones=ask.zones or None, at=at, team_ids=[team_id],
                           max_nodes=ask.max_nodes)
    if ask.provider == ProviderKind.LOCAL:
        # A local pool with no recorded price is priced as the type it stands in for.
        stand_in = shipped_types()[LOCAL_STAND_IN_TYPE].typical_spot_usd_per_hour
        pools = [p if p.spot_usd_per_hour > 0 else PricedPool(**{**{f: getattr(p, f) for f in PricedPool.__slots__},
                                                                  "spot_usd_per_hour": stand_in})
                 for p in pools]
    return pools


def _prediction(c: Candidate, *, capacity: str = DEFAULT_CAPACITY_POLICY,
                catalog: Mapping[str, InstanceSpec] | None = None) -> dict[str, Any]:
    """The planner's figures for `c`, with the on-demand estimate the job's `capacity` policy needs.

    `cost_usd` stays the spot estimate (the planner ranks plans by it). `on_demand_cost_usd` is the
    same work on on-demand nodes at the catalogue's on-demand price: on-demand nodes are not
    preempted, so its hours are the predicted hours without the preemption overhead
    (`hours x goodput_fraction`). None when the catalogue has no price for the type. Which figure a
    page shows follows `capacity`: spot, on_demand, or both for spot_then_on_demand (spot estimate,
    all-on-demand ceiling)."""
    spec = (catalog if catalog is not None else shipped_types()).get(c.instance_type)
    on_demand_hours = c.hours * c.goodput_fraction
    on_demand_price = spec.on_demand_usd_per_hour if spec is not None else None
    return {
        "instance_type": c.instance_type, "zone": c.zone, "nodes": c.nodes, "dp": c.dp, "pp": c.pp,
        "microbatches": c.microbatches, "schedule": c.schedule, "hours": c.hours, "cost_usd": c.cost_usd,
        "step_s": c.step_s, "samples_per_s": c.samples_per_s, "goodput_fraction": c.goodput_fraction,
        "expected_preemptions": c.expected_preemptions, "spot_usd_per_hour": c.spot_usd_per_hour,
        "capacity": capacity, "on_demand_usd_per_hour": on_demand_price, "on_demand_hours": on_demand_hours,
        "on_demand_cost_usd": None if on_demand_price is None else on_demand_hours * c.nodes * on_demand_price,
    }


def plan_estimate(plan: Plan, *, capacity: str = DEFAULT_CAPACITY_POLICY) -> dict[str, Any]:
    """The best plan's figures with the estimate `capacity` needs (spot, and the all-on-demand
    ceiling): what a job submitted with that plan would store as its prediction."""
    return _prediction(plan.best, capacity=capacity)


def plan_job(
    *, team_id: int, contract: dict[str, Any], total_microbatches: int | None, strategy: str, target_steps: int,
    deadline: datetime | None, budget_usd: Decimal | None, ask: PlanAsk, at: datetime | None = None,
    capacity: str = DEFAULT_CAPACITY_POLICY, allow_over_budget: bool = False,
) -> tuple[JobPlan, JobConfig]:
    """The job's plan and its runtime config: the user's explicit layout, or the planner's choice
    (`ask.auto`) over the allowed pools for the deadline or budget. `total_microbatches`: the legacy
    body's micro-batches per step. `capacity`: the job's capacity policy, for the prediction's cost
    estimate (`_prediction`; the choice itself is still made on spot prices). Raises `LayoutError`
    naming the field to change: a layout the runtime cannot run, an unknown instance type, a
    deadline no plan meets (with the fastest plan's predicted time), a budget no plan fits; every
    problem of the contract at once. An explicit plan whose estimate exceeds the budget raises
    `PlanInfeasible` (422) naming both figures, unless `allow_over_budget`."""
    _check_pools(ask)
    runtime_strategy = resolve_strategy(strategy)
    # The model and training fields first, on one node: every problem of the contract at once.
    problems = []
    try:
        base = build_job_config(contract, dp=1, pp=1, microbatches=1, strategy=runtime_strategy, steps=target_steps)
    except LayoutError as exc:
        base, problems = None, each_error(exc)
    global_batch = base.global_batch if base else contract.get("global_batch")
    if total_microbatches is not None and isinstance(global_batch, int) and global_batch % total_microbatches:
        problems.insert(0, LayoutError(f"model_spec.micro_batches={total_microbatches} does not divide "
                                       f"global_batch={global_batch}", field="model_spec.micro_batches"))
    if problems and not ask.auto:  # the layout's own problems too (pp over the layers, ...), once each
        try:
            _explicit(contract, total_microbatches=total_microbatches, strategy=runtime_strategy,
                      target_steps=target_steps, ask=ask)
        except LayoutError as exc:
            named = {p.field for p in problems}
            if "model_spec.micro_batches" in named:  # the global batch's divisibility is that same problem
                named.add("global_batch")
            problems += [p for p in each_error(exc) if p.field not in named]
    if problems:
        raise problems[0] if len(problems) == 1 else LayoutErrors(problems)
    assert base is not None
    if ask.auto and base.model.kind == USER_MODEL_KIND and not base.model.layer_measures:
        return _profile_first(base, ask=ask)
    if base.model.kind == USER_MODEL_KIND and not base.model.layers:
        # The control plane splits the model when it reacts to a lost node, and cannot count the layers itself.
        raise LayoutError(f"model.layers is not set for the model function {base.model.path}; expected its layer "
                          "count, which `spotpipe submit` records by validating the model on your machine",
                          field="model.layers")
    if ask.auto:
        return _planned(base, contract, team_id=team_id, total_microbatches=total_microbatches, deadline=deadline,
                        budget_usd=budget_usd, ask=ask, at=at or timezone.now(), capacity=capacity)
    plan, config = _explicit(contract, total_microbatches=total_microbatches, strategy=runtime_strategy,
                             target_steps=target_steps, ask=ask)
    if deadline is None and budget_usd is None:
        return plan, config
    # A deadline or a budget is judged from the start (the capacity rule, the budget's projection):
    # the explicit layout gets the planner's estimate as its prediction until its own samples arrive.
    estimated = explicit_plan_estimate(config=config, ask=ask, team_id=team_id, at=at or timezone.now())
    if estimated is None:
        return plan, config
    estimate, catalog = estimated
    plan = dataclasses.replace(plan, predicted=_prediction(estimate, capacity=capacity, catalog=catalog))
    if budget_usd is not None and not allow_over_budget and Decimal(str(estimate.cost_usd)) > budget_usd:
        raise PlanInfeasible(
            f"the plan (dp={config.dp} x pp={config.pp} on {estimate.nodes} x {estimate.instance_type}) is "
            f"estimated at ${estimate.cost_usd:.2f} for {target_steps} steps ({_duration(estimate.hours)}), more "
            f"than the budget of ${budget_usd}; raise budget_usd, change the plan, or submit with "
            "allow_over_budget (the job then stops at its budget)", field="budget_usd", nearest=estimate)
    return plan, config


def explicit_plan_estimate(*, config: JobConfig, ask: PlanAsk, team_id: int,
                           at: datetime) -> tuple[Candidate, Mapping[str, InstanceSpec]] | None:
    """The planner's estimate of an explicit layout: `config`'s dp x pp priced on the cheapest of the
    plan's allowed pools, as the acquisition would buy it, with the catalogue it was priced from.
    None when the planner cannot price it (a model function never measured, no known pool)."""
    if config.model.kind == USER_MODEL_KIND and not config.model.layer_measures:
        return None
    mbs = config.microbatch_size
    planner = _local_planner(config, mbs) if ask.provider == ProviderKind.LOCAL else _planner()
    pools = [p for p in _priced_pools(ask, team_id=team_id, at=at) if p.instance_type in planner.catalog]
    if not pools:
        return None
    request = PlanRequest(model=config.model, global_batch=config.global_batch,
                          samples=config.steps * config.global_batch, pools=pools, strategy=config.strategy,
                          microbatch_size=mbs, schedules=(config.schedule,), max_pp=config.pp)
    try:
        candidates, _skipped = planner.candidates(request)
    except (PlanError, ValueError, KeyError):
        return None
    fitting = [c for c in candidates if c.dp == config.dp and c.pp == config.pp]
    return (min(fitting, key=lambda c: c.cost_usd), planner.catalog) if fitting else None


def _profile_first(base: JobConfig, *, ask: PlanAsk) -> tuple[JobPlan, JobConfig]:
    """`plan.auto` for a model function sent without its per-layer measures (the control plane never
    imports user code, and `spotpipe submit` was not the client): one node of the cheapest allowed
    pool runs first, measures the model where its code and data are, and the planner plans the job
    from that (`plan_from_profile`). The plan keeps the request's pools and limits for it."""
    plan = JobPlan(provider=ask.provider, pools=plan_pools(ask), nodes=1, chosen_by="planner",
                   objective="profile first", replan=ask.replan, max_nodes=ask.max_nodes, regions=ask.regions,
                   profile=PROFILE_PENDING)
    return plan, base


def _explicit(contract: dict[str, Any], *, total_microbatches: int | None, strategy: str, target_steps: int,
              ask: PlanAsk) -> tuple[JobPlan, JobConfig]:
    """The user's layout, checked by building it."""
    layout = explicit_layout(dp=ask.dp, pp=ask.pp, microbatches=ask.microbatches,
                             total_microbatches=total_microbatches)
    config = build_job_config(contract, **layout, strategy=strategy, steps=target_steps)
    if (ask.provider != ProviderKind.LOCAL and config.model.kind != USER_MODEL_KIND and ask.instance_types
            and all(t in (planner := _planner()).catalog for t in ask.instance_types)
            and config.device_time is None and not config.layer_costs):
        # Real instances and no time scale of the user's: state what the planner would price the
        # types with, so recycle's spill prices a new host's traffic (the user's `link_gbps` wins).
        stated = _stated_costs(planner, config.model, ask.instance_types, config.microbatch_size)
        contract = {**contract, "layer_costs": stated["layer_costs"],
                    "link_gbps": contract.get("link_gbps", stated["link_gbps"])}
        config = build_job_config(contract, **layout, strategy=strategy, steps=target_steps)
    plan = JobPlan(provider=ask.provider, pools=plan_pools(ask), nodes=ask.nodes or config.num_nodes,
                   chosen_by="user", regions=ask.regions)
    return plan, config


def _planned(base: JobConfig, contract: dict[str, Any], *, team_id: int, total_microbatches: int | None,
             deadline: datetime | None, budget_usd: Decimal | None, ask: PlanAsk, at: datetime,
             capacity: str = DEFAULT_CAPACITY_POLICY) -> tuple[JobPlan, JobConfig]:
    """The planner's choice for `base` (the contract on one node) over the allowed pools."""
    if ask.provider == ProviderKind.LOCAL and base.device_time is None:
        # Local nodes emulate a device's step time; the plan is made, and run, with that time.
        base.device_time = DeviceTime()
    mbs = base.global_batch // total_microbatches if total_microbatches else default_microbatch_size(base.global_batch)
    planner = _local_planner(base, mbs) if ask.provider == ProviderKind.LOCAL else _planner()
    request = PlanRequest(
        model=base.model, global_batch=base.global_batch, samples=base.steps * base.global_batch,
        pools=_priced_pools(ask, team_id=team_id, at=at),
        deadline_hours=(deadline - at).total_seconds() / 3600.0 if deadline is not None else None,
        budget_usd=float(budget_usd) if budget_usd is not None else None,
        strategy=base.strategy, microbatch_size=mbs,
        schedules=(base.schedule,) if "schedule" in contract else SCHEDULES,
        max_pp=min(16, base.model.max_stages),
    )
    try:
        chosen = planner.plan(request)
    except PlanError as exc:
        raise _plan_error(exc, deadline=deadline, deadline_hours=request.deadline_hours) from exc
    best = chosen.best
    contract = {k: v for k, v in contract.items() if k != "schedule"}
    if base.device_time is not None:
        contract["device_time"] = dataclasses.asdict(base.device_time)
    pools = [PlanPool(instance_type=best.instance_type, zone=best.zone,
                      region=LOCAL_REGION if ask.provider == ProviderKind.LOCAL else region_of_zone(best.zone))]
    # The job states the per-layer seconds and link bandwidth the plan was priced with (replacing any
    # the contract gave): its stages are cut as the planner cut them, and recycle's spill prices a
    # new host's traffic on real instances too (`runtime.strategies.links.stated_by_cost_models`).
    contract.update(_stated_costs(planner, base.model, [p.instance_type for p in pools], mbs))
    config = build_job_config(contract, dp=best.dp, pp=best.pp, microbatches=best.microbatches,
                              schedule=best.schedule, strategy=base.strategy, steps=base.steps)
    plan = JobPlan(
        provider=ask.provider, pools=pools,
        nodes=best.nodes, chosen_by="planner", objective=chosen.objective,
        predicted=_prediction(best, capacity=capacity, catalog=planner.catalog),
        runner_ups=_runner_ups(chosen, capacity=capacity, catalog=planner.catalog), replan=ask.replan,
        max_nodes=ask.max_nodes, regions=ask.regions,
    )
    return plan, config


def _stated_costs(planner: Planner, model: ModelSpec, instance_types: Iterable[str], microbatch_size: int
                  ) -> dict[str, float | list[float]]:
    """The `layer_costs` and `link_gbps` of a job that may run on `instance_types`, from the cost
    models `planner` prices them with (`runtime.strategies.links.stated_by_cost_models`)."""
    return stated_by_cost_models([planner.cost_model(model, t, microbatch_size) for t in dict.fromkeys(instance_types)])


def _plan_error(exc: PlanError, *, deadline: datetime | None, deadline_hours: float | None) -> LayoutError:
    """The planner's refusal under the request's field names; a missed deadline names the fastest plan."""
    field = PLAN_ERROR_FIELDS.get(exc.field, exc.field)
    message = exc.message.replace("deadline_hours", "deadline")
    if exc.field == "deadline_hours" and exc.nearest is not None and deadline is not None:
        fastest = exc.nearest
        message = (f"no plan meets the deadline {deadline.isoformat()} (in {_duration(deadline_hours)}): "
                   f"the fastest plan, {fastest.nodes} x {fastest.instance_type} as dp={fastest.dp} x "
                   f"pp={fastest.pp}, is predicted to take {_duration(fastest.hours)} "
                   f"(${fastest.cost_usd:.2f}); give a later deadline or allow more nodes (plan.max_nodes)")
    return LayoutError(message, field=field)


def _runner_ups(chosen: Plan, *, capacity: str = DEFAULT_CAPACITY_POLICY,
                catalog: Mapping[str, InstanceSpec] | None = None) -> list[dict[str, Any]]:
    """The next best layouts after the chosen one (one entry per pool and dp x pp, best schedule)."""
    best = chosen.best
    seen = {(best.instance_type, best.zone, best.dp, best.pp)}
    out = []
    for c in chosen.alternatives:
        key = (c.instance_type, c.zone, c.dp, c.pp)
        if key not in seen and c.feasible:
            seen.add(key)
            out.append(_prediction(c, capacity=capacity, catalog=catalog))
        if len(out) == RUNNER_UPS:
            break
    return out


def _duration(hours: float | None) -> str:
    """A prediction's duration in the unit a person reads it in."""
    if hours is None:
        return "-"
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{hours:.1f} h"
