"""The planner: search instance type x node count x DP x PP for a job, price each candidate with
spot prices and expected preemption loss, and return the best plan with the alternatives.

Pure Python, no Django: prices and preemption rates come in as plain `Pool` values (the control
plane's `planning` app fills them from the market and the recorded notices).

Search: every (pool, nodes, pp, schedule) whose stages fit in memory is first priced with the
closed-form step time (`CostModel.analytic_step_time`); the best `refine` candidates by the
objective are then re-priced by replaying the runtime's schedule (`CostModel.pipeline_step_time`)
and the best of those is the plan. `exhaustive=True` replays every candidate (the benchmark's
reference optimum).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from runtime.checkpointing.youngdaly import young_interval
from runtime.config import AUTO_STRATEGY, ModelSpec, resolve_strategy
from runtime.parallel.layout import split_microbatches
from runtime.parallel.throughput import CostModel, Network
from runtime.planner.catalog import InstanceSpec, instance_types
from runtime.planner.predictor import ProfilePredictor, default_predictor
from runtime.planner.profile import BYTES_PER_PARAM_TRAINING, DeviceSpec, ModelProfile, ProfileStore
from runtime.strategies import get_strategy

MEMORY_HEADROOM = 0.9
"""Fraction of device memory the planner lets a stage use (allocator fragmentation, workspace)."""

CHECKPOINT_COST_S = 30.0
SCREEN_SLACK = 0.2
"""The closed form is within about 15% of the replay; candidates that miss a limit by less than this
are still replayed, so a limit near the boundary is decided by the exact model."""


class PlanError(ValueError):
    """A request the planner cannot satisfy. `field` names the input to change; `nearest` is the
    closest feasible plan when there is one."""

    def __init__(self, message: str, *, field: str, nearest: Candidate | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.nearest = nearest


@dataclass(frozen=True, kw_only=True, slots=True)
class Pool:
    """An allowed spot pool with its current price and preemption rate."""

    instance_type: str
    zone: str = ""
    spot_usd_per_hour: float
    on_demand_usd_per_hour: float | None = None
    preemptions_per_node_hour: float = 0.0
    risk_source: str = "given"
    """Where the rate came from: `notices` (our recorded interruptions), `advisor` or `given`."""
    max_nodes: int = 64


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    model: ModelSpec
    global_batch: int
    """Samples per optimizer step."""
    samples: int
    """Samples to train in all."""
    pools: list[Pool]
    deadline_hours: float | None = None
    budget_usd: float | None = None
    strategy: str = AUTO_STRATEGY
    microbatch_size: int = 0
    """Samples per micro-batch; 0 picks the largest power of two <= 8 that divides the global batch."""
    schedules: tuple[str, ...] = ("1f1b", "fiw")
    max_pp: int = 16


@dataclass(slots=True)
class Candidate:
    instance_type: str
    zone: str
    nodes: int
    dp: int
    pp: int
    microbatches: int
    """Micro-batches per pipeline per step."""
    schedule: str
    step_s: float
    samples_per_s: float
    goodput_fraction: float
    hours: float
    cost_usd: float
    expected_preemptions: float
    p_no_preemption: float
    spot_usd_per_hour: float
    preemptions_per_node_hour: float
    risk_source: str
    peak_memory_gib: float
    stages: list[tuple[int, int]]
    model: str = "analytic"
    """`analytic` (closed form) or `replay` (runtime schedule replayed)."""
    feasible: bool = True
    reason: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stages"] = [list(s) for s in self.stages]
        return d


@dataclass(slots=True)
class Plan:
    best: Candidate
    alternatives: list[Candidate]
    templates: list[dict]
    considered: int
    search_s: float
    objective: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self, *, limit: int = 50) -> dict:
        return {
            "best": self.best.to_dict(),
            "objective": self.objective,
            "considered": self.considered,
            "search_seconds": round(self.search_s, 4),
            "templates": self.templates,
            "alternatives": [c.to_dict() for c in self.alternatives[:limit]],
            "notes": self.notes,
        }


def goodput_fraction(*, strategy: str, nodes: int, rate_per_node_hour: float, step_s: float) -> float:
    """Expected fraction of wall time that makes progress under preemptions at the given rate.

    Each preemption costs the strategy's recovery time plus half a step (the step in flight);
    checkpoint-restart also pays checkpoint writes C/T and half an interval T/2 of rework, with T
    Young's sqrt(2 C MTBF). Failures arrive at nodes * rate per hour.
    """
    lam = nodes * rate_per_node_hour / 3600.0  # failures per second for the job
    if lam <= 0:
        return 1.0
    recovery_s = get_strategy(resolve_strategy(strategy)).recovery_s  # the strategy's own figure
    if get_strategy(resolve_strategy(strategy)).restarts_from_checkpoint:
        mtbf = 1.0 / lam
        interval = young_interval(checkpoint_cost_s=CHECKPOINT_COST_S, mtbf_s=mtbf)
        waste = CHECKPOINT_COST_S / interval + (interval / 2 + recovery_s) / mtbf
        return max(0.0, 1.0 - waste)
    lost_per_failure = recovery_s + step_s / 2
    return 1.0 / (1.0 + lam * lost_per_failure)


class Planner:
    """Holds per-instance-type cost models (measured or predicted profiles) and searches plans."""

    def __init__(
        self,
        *,
        profiles: dict[str, ModelProfile] | None = None,
        store: ProfileStore | None = None,
        predictor: ProfilePredictor | None = None,
        catalog: dict[str, InstanceSpec] | None = None,
    ) -> None:
        """`profiles`: measured profile per instance type; `store`: a profile directory (measured
        profiles found there win over predictions, and the predictor is fitted on all of them)."""
        self.profiles = profiles or {}
        self.store = store
        if predictor is None and store is not None:
            measured = [p for p in store.all() if p.measured]
            predictor = ProfilePredictor.fit(measured) if measured else None
        self.predictor = predictor or default_predictor()
        self.catalog = catalog or instance_types()
        self._models: dict[tuple, CostModel] = {}
        self._profiles: dict[tuple, ModelProfile] = {}

    # -- models --------------------------------------------------------------------------------
    def profile_for(self, spec: ModelSpec, instance_type: str, microbatch_size: int) -> ModelProfile:
        """The measured profile of this type when one was given, else the learned prediction."""
        key = (instance_type, repr(spec), microbatch_size)
        if key not in self._profiles:
            measured = self.profiles.get(instance_type)
            stored = self.store.load(instance_type, spec, microbatch_size) if self.store else None
            if measured and measured.model == asdict(spec) and measured.microbatch_size == microbatch_size:
                self._profiles[key] = measured
            elif stored is not None:
                self._profiles[key] = stored
            else:
                it = self.catalog[instance_type]
                device = DeviceSpec(
                    name=it.name,
                    peak_tflops=it.peak_tflops,
                    memory_bandwidth_gbs=it.memory_bandwidth_gbs,
                    network_gbps=it.network_gbps,
                )
                self._profiles[key] = self.predictor.predict(
                    spec, microbatch_size=microbatch_size, device=device, instance_type=instance_type
                )
        return self._profiles[key]

    def cost_model(self, spec: ModelSpec, instance_type: str, microbatch_size: int) -> CostModel:
        key = (instance_type, repr(spec), microbatch_size)
        if key not in self._models:
            prof = self.profile_for(spec, instance_type, microbatch_size)
            it = self.catalog.get(instance_type)
            network = Network(bandwidth_gbps=it.network_gbps if it and it.network_gbps else 10.0)
            self._models[key] = CostModel.from_profile(prof, network=network)
        return self._models[key]

    def bounds(self, cost: CostModel, pp: int) -> list[tuple[int, int]]:
        return cost.bounds(pp)

    def peak_memory_bytes(self, prof: ModelProfile, bounds: list[tuple[int, int]], microbatches: int) -> float:
        """Largest per-node memory: parameters + optimizer state + activations of in-flight micro-batches."""
        pp = len(bounds)
        worst = 0.0
        for s, (lo, hi) in enumerate(bounds):
            params = sum(prof.layers[i].param_bytes for i in range(lo, hi)) / 4 * BYTES_PER_PARAM_TRAINING
            in_flight = min(pp - s, microbatches)
            acts = sum(prof.layers[i].activation_bytes for i in range(lo, hi)) * in_flight
            worst = max(worst, params + acts)
        return worst

    # -- search --------------------------------------------------------------------------------
    def candidates(self, request: PlanRequest) -> tuple[list[Candidate], list[str]]:
        """Every layout of every pool, priced with the closed-form step time. Returns (fitting
        candidates, reasons why whole pools were skipped)."""
        spec = request.model
        mbs = request.microbatch_size or default_microbatch_size(request.global_batch)
        out: list[Candidate] = []
        skipped: list[str] = []
        for pool in request.pools:
            if pool.instance_type not in self.catalog:
                skipped.append(f"{pool.instance_type}: unknown instance type")
                continue
            it = self.catalog[pool.instance_type]
            cost = self.cost_model(spec, pool.instance_type, mbs)
            prof = self.profile_for(spec, pool.instance_type, mbs)
            capacity = it.device_memory_bytes * MEMORY_HEADROOM
            fits_any = False
            for pp in range(1, min(request.max_pp, spec.max_stages, pool.max_nodes) + 1):
                bounds = self.bounds(cost, pp)
                for dp in range(1, pool.max_nodes // pp + 1):
                    if request.global_batch % (dp * mbs):
                        continue
                    microbatches = request.global_batch // (dp * mbs)
                    mem = self.peak_memory_bytes(prof, bounds, microbatches)
                    if mem > capacity:
                        continue
                    fits_any = True
                    for schedule in request.schedules:
                        step = cost.analytic_step_time(pp=pp, microbatches=microbatches, dp=dp, schedule=schedule)
                        out.append(self._price(request, pool, dp, pp, microbatches, schedule, step, mem, bounds))
            if not fits_any:
                need = min(
                    self.peak_memory_bytes(prof, self.bounds(cost, pp), 1)
                    for pp in range(1, min(request.max_pp, spec.max_stages, pool.max_nodes) + 1)
                )
                skipped.append(
                    f"{pool.instance_type}: the model needs at least {need / 2**30:.1f} GiB per node even split "
                    f"over {min(request.max_pp, spec.max_stages, pool.max_nodes)} stages; the type has "
                    f"{it.device_memory_gib:.0f} GiB ({MEMORY_HEADROOM:.0%} usable)"
                )
        return out, skipped

    def _price(self, request, pool, dp, pp, microbatches, schedule, step, mem, bounds, model="analytic"):  # type: ignore[no-untyped-def]
        nodes = dp * pp
        good = goodput_fraction(
            strategy=request.strategy, nodes=nodes, rate_per_node_hour=pool.preemptions_per_node_hour, step_s=step
        )
        rate = request.global_batch / step
        hours = request.samples / max(rate * good, 1e-12) / 3600.0
        expected = nodes * pool.preemptions_per_node_hour * hours
        cand = Candidate(
            instance_type=pool.instance_type,
            zone=pool.zone,
            nodes=nodes,
            dp=dp,
            pp=pp,
            microbatches=microbatches,
            schedule=schedule,
            step_s=step,
            samples_per_s=rate,
            goodput_fraction=good,
            hours=hours,
            cost_usd=hours * nodes * pool.spot_usd_per_hour,
            expected_preemptions=expected,
            p_no_preemption=math.exp(-expected),
            spot_usd_per_hour=pool.spot_usd_per_hour,
            preemptions_per_node_hour=pool.preemptions_per_node_hour,
            risk_source=pool.risk_source,
            peak_memory_gib=mem / 2**30,
            stages=list(bounds),
            model=model,
        )
        reasons = []
        if request.deadline_hours is not None and hours > request.deadline_hours:
            reasons.append(f"takes {hours:.2f} h > deadline {request.deadline_hours:g} h")
        if request.budget_usd is not None and cand.cost_usd > request.budget_usd:
            reasons.append(f"costs ${cand.cost_usd:.2f} > budget ${request.budget_usd:g}")
        cand.feasible = not reasons
        cand.reason = "; ".join(reasons)
        return cand

    def replay(self, request: PlanRequest, cand: Candidate) -> Candidate:
        """The candidate re-priced with the runtime's schedule replayed."""
        mbs = request.microbatch_size or default_microbatch_size(request.global_batch)
        cost = self.cost_model(request.model, cand.instance_type, mbs)
        step = cost.pipeline_step_time(
            request.model, pp=cand.pp, microbatches=cand.microbatches, dp=cand.dp, schedule=cand.schedule
        )
        pool = next(p for p in request.pools if p.instance_type == cand.instance_type and p.zone == cand.zone)
        bounds = [tuple(b) for b in cand.stages]
        return self._price(
            request,
            pool,
            cand.dp,
            cand.pp,
            cand.microbatches,
            cand.schedule,
            step,
            cand.peak_memory_gib * 2**30,
            bounds,
            model="replay",
        )

    def plan(self, request: PlanRequest, *, refine: int = 4, exhaustive: bool = False) -> Plan:
        """The best plan for `request`, or `PlanError` with the nearest feasible plan."""
        _validate(request)
        # Profiles (measured, or predicted once per type and cached) are inputs, not search.
        prepared = time.perf_counter()
        mbs = request.microbatch_size or default_microbatch_size(request.global_batch)
        for pool in request.pools:
            if pool.instance_type in self.catalog:
                self.cost_model(request.model, pool.instance_type, mbs)
        started = time.perf_counter()
        profile_s = started - prepared
        cands, skipped = self.candidates(request)
        objective = _objective(request)
        if not cands:
            raise PlanError(
                "the model fits no allowed instance type: " + "; ".join(skipped) + _bigger_types_hint(self, request),
                field="pools",
                nearest=self._nearest_on_other_types(request),
            )
        cands.sort(key=objective)
        if exhaustive:
            refined = [self.replay(request, c) for c in cands]
        else:
            # Replay the best few by the objective, the best few that the closed form calls feasible,
            # and the fastest and cheapest few (the nearest plans if nothing turns out feasible).
            slack = [c for c in cands if self._within(request, c, SCREEN_SLACK)]
            head = (
                cands[:refine]
                + sorted(slack, key=objective_ignoring_feasibility(request))[:refine]
                + sorted(cands, key=lambda c: c.hours)[:refine]
                + sorted(cands, key=lambda c: c.cost_usd)[:refine]
            )
            seen, refined = set(), []
            for c in head:
                if _key(c) not in seen:
                    seen.add(_key(c))
                    refined.append(self.replay(request, c))
        refined.sort(key=objective)
        feasible = [c for c in refined if c.feasible]
        elapsed = time.perf_counter() - started
        if not feasible:
            raise _infeasible(request, refined)
        best = feasible[0]
        others = sorted(
            [c for c in cands if (c.instance_type, c.zone, c.dp, c.pp, c.schedule) != _key(best)], key=objective
        )
        notes = [f"skipped {s}" for s in skipped]
        notes.append(
            f"{len(cands)} candidates priced in closed form, {len(refined)} re-priced by replaying the runtime "
            f"schedule; profiles prepared in {profile_s:.2f} s before the search"
        )
        return Plan(
            best=best,
            alternatives=[best, *others],
            templates=self.templates(request, best),
            considered=len(cands),
            search_s=elapsed,
            objective=objective.__doc__ or "",
            notes=notes,
        )

    def _nearest_on_other_types(self, request: PlanRequest) -> Candidate | None:
        """The best plan on known types that were not allowed (typical spot price, advisor risk)."""
        allowed = {p.instance_type for p in request.pools}
        max_nodes = max(p.max_nodes for p in request.pools)
        others = [
            Pool(
                instance_type=t.name,
                spot_usd_per_hour=t.typical_spot_usd_per_hour,
                on_demand_usd_per_hour=t.on_demand_usd_per_hour,
                preemptions_per_node_hour=t.advisor_rate_per_node_hour or 0.0,
                risk_source="advisor",
                max_nodes=max_nodes,
            )
            for t in self.catalog.values()
            if t.name not in allowed and t.accelerators
        ]
        if not others:
            return None
        relaxed = PlanRequest(**{**{f: getattr(request, f) for f in PlanRequest.__slots__}, "pools": others})
        cands, _ = self.candidates(relaxed)
        if not cands:
            return None
        objective = _objective(relaxed)
        best = min(cands, key=objective)
        return self.replay(relaxed, best)

    @staticmethod
    def _within(request: PlanRequest, c: Candidate, slack: float) -> bool:
        """Could the candidate meet the limits once replayed (closed form within `slack`)?"""
        if request.deadline_hours is not None and c.hours > request.deadline_hours * (1 + slack):
            return False
        return not (request.budget_usd is not None and c.cost_usd > request.budget_usd * (1 + slack))

    def templates(self, request: PlanRequest, best: Candidate) -> list[dict]:
        """Pipeline templates (Oobleck's idea) for every node count from the fewest that fit in memory
        up to the plan's size.

        For n nodes: k pipelines of sizes differing by at most one (sum n), each cut into balanced
        stages, micro-batches shared in proportion to size (the global batch never changes); the k
        with the shortest closed-form step wins. `dp`/`pp` are given when all pipelines are equal."""
        mbs = request.microbatch_size or default_microbatch_size(request.global_batch)
        cost = self.cost_model(request.model, best.instance_type, mbs)
        prof = self.profile_for(request.model, best.instance_type, mbs)
        capacity = self.catalog[best.instance_type].device_memory_bytes * MEMORY_HEADROOM
        total_mb = request.global_batch // mbs
        max_pp = min(request.model.max_stages, request.max_pp)
        out = []
        for n in range(1, best.nodes + 1):
            options = []
            for k in range(1, min(n, total_mb) + 1):
                sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
                if max(sizes) > max_pp:
                    continue
                shares = split_microbatches(total_mb, sizes)
                if min(shares) < 1:
                    continue
                fits = all(
                    self.peak_memory_bytes(prof, self.bounds(cost, size), share) <= capacity
                    for size, share in set(zip(sizes, shares, strict=True))
                )
                if not fits:
                    continue
                step = max(
                    cost.analytic_step_time(pp=size, microbatches=share, dp=k, schedule=best.schedule)
                    for size, share in set(zip(sizes, shares, strict=True))
                )
                options.append((step, k, sizes, shares))
            if not options:
                continue
            step, k, sizes, shares = min(options, key=lambda o: (o[0], o[1]))
            uniform = len(set(sizes)) == 1
            out.append(
                {
                    "nodes": n,
                    "dp": k if uniform else None,
                    "pp": sizes[0] if uniform else None,
                    "pipelines": [
                        {"nodes": size, "microbatches": share, "stages": [list(b) for b in self.bounds(cost, size)]}
                        for size, share in zip(sizes, shares, strict=True)
                    ],
                    "step_s": step,
                    "samples_per_s": request.global_batch / step,
                }
            )
        return out


def objective_ignoring_feasibility(request: PlanRequest):  # type: ignore[no-untyped-def]
    """The objective's own measure (time or cost), whatever the limits say."""
    if request.budget_usd is not None and request.deadline_hours is None:
        return lambda c: (c.hours, c.cost_usd)
    return lambda c: (c.cost_usd, c.hours)


def _key(c: Candidate) -> tuple:
    return (c.instance_type, c.zone, c.dp, c.pp, c.schedule)


def default_microbatch_size(global_batch: int) -> int:
    """The largest power of two <= 8 that divides the global batch (samples per micro-batch)."""
    for size in (8, 4, 2, 1):
        if global_batch % size == 0:
            return size
    return 1


def _objective(request: PlanRequest):  # type: ignore[no-untyped-def]
    if request.budget_usd is not None and request.deadline_hours is None:

        def fastest(c: Candidate) -> tuple:
            """fastest plan within the budget"""
            return (not c.feasible, c.hours, c.cost_usd)

        return fastest

    def cheapest(c: Candidate) -> tuple:
        """cheapest plan that meets the deadline (and budget)"""
        return (not c.feasible, c.cost_usd, c.hours)

    return cheapest


def _validate(request: PlanRequest) -> None:
    checks = [
        ("global_batch", request.global_batch >= 1, "must be at least 1"),
        ("samples", request.samples >= 1, "must be at least 1"),
        ("pools", bool(request.pools), "must name at least one pool"),
        ("deadline_hours", request.deadline_hours is None or request.deadline_hours > 0, "must be positive"),
        ("budget_usd", request.budget_usd is None or request.budget_usd > 0, "must be positive"),
        ("microbatch_size", request.microbatch_size >= 0, "must be >= 0 (0 = automatic)"),
    ]
    for name, ok, message in checks:
        if not ok:
            raise PlanError(f"{name}={getattr(request, name)!r} {message}", field=name)
    if request.microbatch_size and request.global_batch % request.microbatch_size:
        raise PlanError(
            f"global_batch={request.global_batch} is not a multiple of microbatch_size={request.microbatch_size}",
            field="microbatch_size",
        )
    try:
        request.model.validate()
    except ValueError as exc:
        raise PlanError(str(exc), field="model") from exc


def _infeasible(request: PlanRequest, refined: list[Candidate]) -> PlanError:
    fastest = min(refined, key=lambda c: c.hours)
    cheapest = min(refined, key=lambda c: c.cost_usd)
    if request.deadline_hours is not None and fastest.hours > request.deadline_hours:
        return PlanError(
            f"the deadline of {request.deadline_hours:g} h cannot be met: the fastest plan "
            f"({fastest.nodes} x {fastest.instance_type}, dp={fastest.dp} pp={fastest.pp}) needs "
            f"{fastest.hours:.2f} h and ${fastest.cost_usd:.2f}",
            field="deadline_hours",
            nearest=fastest,
        )
    if request.budget_usd is not None and cheapest.cost_usd > request.budget_usd:
        return PlanError(
            f"the budget of ${request.budget_usd:g} is too small: the cheapest plan "
            f"({cheapest.nodes} x {cheapest.instance_type}, dp={cheapest.dp} pp={cheapest.pp}) costs "
            f"${cheapest.cost_usd:.2f} and takes {cheapest.hours:.2f} h",
            field="budget_usd",
            nearest=cheapest,
        )
    # Deadline and budget both set, each reachable alone but not together.
    in_time = [c for c in refined if request.deadline_hours is None or c.hours <= request.deadline_hours]
    nearest = min(in_time or refined, key=lambda c: c.cost_usd)
    return PlanError(
        f"no plan meets both the deadline of {request.deadline_hours:g} h and the budget of ${request.budget_usd:g}: "
        f"the cheapest plan in time costs ${nearest.cost_usd:.2f}",
        field="budget_usd",
        nearest=nearest,
    )


def _bigger_types_hint(planner: Planner, request: PlanRequest) -> str:
    allowed = {p.instance_type for p in request.pools}
    bigger = sorted(
        (t for t in planner.catalog.values() if t.name not in allowed and t.accelerators),
        key=lambda t: -t.device_memory_gib,
    )
    return f" (the largest known type is {bigger[0].name} with {bigger[0].device_memory_gib:.0f} GiB)" if bigger else ""
