"""Capacity-type policies of a gang job over spot availability traces and price histories.

A discrete-time simulation, one step per trace tick: a job needs `nodes` nodes of one capacity type
in one region at once and makes progress only while it holds them (after the restart overhead each
(re)start, switch or region move costs). Spot nodes are held while the region's availability count
stays at or above `nodes`; when it falls below, the job loses its nodes (it holds and pays nothing
while it waits). On-demand is always available. Cost is node-hours held times the price of the tick
(the region's spot price, or the on-demand price). A job still unfinished when the trace ends is
finished on on-demand after it (its cost and finish time say so: `beyond_trace`).

Policies: `SPOT`, `SPOT_THEN_ON_DEMAND` (`runtime.planner.capacity_policy.choose_capacity_type`)
and `ON_DEMAND` run in the home region (the first); SkyPilot's two spot recovery strategies move:
`EAGER_NEXT_REGION` relaunches a preempted job in the next region with capacity (the preempted one
last), `FAILOVER` retries the preempted region first and goes elsewhere only when it has none.
`SPOT_THEN_ON_DEMAND_FAILOVER` is the rule with spot from any region, as the control plane runs a
job with several regions: it moves only after waiting `region_patience_s` for spot in its own.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

from runtime.planner.capacity_policy import ON_DEMAND, SPOT, SPOT_THEN_ON_DEMAND, choose_capacity_type
from runtime.sim.prices import PriceSeries, load_price_series
from runtime.traces import AVAILABILITY_COUNT, Trace, load_trace

EAGER_NEXT_REGION = "skypilot_eager_next_region"
FAILOVER = "skypilot_failover"
SPOT_THEN_ON_DEMAND_FAILOVER = "spot_then_on_demand_failover"
"""The rule with spot in any region (FAILOVER's order), on-demand in the home region."""
SIM_POLICIES = (SPOT, SPOT_THEN_ON_DEMAND, ON_DEMAND, EAGER_NEXT_REGION, FAILOVER, SPOT_THEN_ON_DEMAND_FAILOVER)

BUNDLED = Path(__file__).with_name("data")
BUNDLED_REGIONS = ("us-east-1", "us-west-2")
"""The bundled synthetic availability traces (runtime/sim/data/README.md); the first is the home region."""
BUNDLED_PRICES = BUNDLED / "spot-prices-p3.2xlarge.tsv"
BUNDLED_INSTANCE_TYPE = "p3.2xlarge"


@dataclass(frozen=True, slots=True)
class Region:
    """One region's spot pool: nodes available and spot USD per node-hour, per tick."""

    name: str
    available: tuple[int, ...]
    spot_usd_per_hour: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Market:
    regions: tuple[Region, ...]
    """The first is the job's home region."""
    gap_s: float
    on_demand_usd_per_hour: float

    @property
    def ticks(self) -> int:
        return min(len(r.available) for r in self.regions)


@dataclass(frozen=True, slots=True)
class Job:
    nodes: int
    work_h: float
    """Time the work takes at full speed on `nodes` nodes."""
    deadline_h: float
    """From the job's start."""
    start_tick: int = 0
    overhead_h: float = 0.1
    """Progress lost to each (re)start, switch of capacity type or region move."""


@dataclass(slots=True)
class Outcome:
    policy: str
    cost_usd: float
    on_demand_cost_usd: float
    """The same job all on on-demand: nodes x (work + one start) x on-demand price."""
    finish_h: float
    met: bool
    launches: int = 0
    region_moves: int = 0
    spot_node_hours: float = 0.0
    on_demand_node_hours: float = 0.0
    beyond_trace: bool = False

    @property
    def cost_vs_on_demand(self) -> float:
        return self.cost_usd / self.on_demand_cost_usd

    def as_dict(self) -> dict:
        return {**asdict(self), "cost_vs_on_demand": self.cost_vs_on_demand}


def counts_per_tick(trace: Trace, gap_s: float) -> list[int]:
    """The trace's live node count at each tick start (0, gap, 2 gap, ... before its end)."""
    series = trace.node_count_series()
    out, k, live = [], 0, 0
    for tick in range(round(trace.duration_s / gap_s)):
        t = tick * gap_s
        while k < len(series) and series[k][0] <= t:
            live = series[k][1]
            k += 1
        out.append(live)
    return out


def region_from(trace: Trace, prices: PriceSeries, *, name: str | None = None) -> Region:
    """A region from a tick trace (its `gap_seconds`) and a spot price series on the same clock."""
    gap = float(trace.meta["gap_seconds"])
    counts = counts_per_tick(trace, gap)
    return Region(name or trace.meta.get("region", trace.name), tuple(counts),
                  tuple(prices.at(i * gap) for i in range(len(counts))))


def bundled_market(on_demand_usd_per_hour: float) -> Market:
    """The bundled regions (`BUNDLED_REGIONS`, home first) with the bundled spot prices."""
    regions, gaps = [], set()
    for path in bundled_trace_paths():
        trace = load_trace(path, format=AVAILABILITY_COUNT)
        prices, _ = load_price_series(BUNDLED_PRICES, instance_type=BUNDLED_INSTANCE_TYPE, zone=trace.meta["zone_id"])
        regions.append(region_from(trace, prices, name=trace.meta["region"]))
        gaps.add(float(trace.meta["gap_seconds"]))
    if len(gaps) != 1:
        raise ValueError(f"bundled traces differ in tick length: {sorted(gaps)}")
    return Market(tuple(regions), gaps.pop(), on_demand_usd_per_hour)


def bundled_trace_paths() -> list[Path]:
    """The bundled availability-count traces, home region first."""
    return [BUNDLED / f"availability-{BUNDLED_INSTANCE_TYPE}-16node-{name}.json" for name in BUNDLED_REGIONS]


def estimate_spot_progress_rate(regions: list[Region], *, nodes: int, end_tick: int, lookback_ticks: int,
                                gap_s: float, overhead_s: float, floor: float = 0.05) -> float | None:
    """Work per wall second spot gave a `nodes`-node job over the `lookback_ticks` before `end_tick`
    in any of `regions`: the share of ticks with capacity in one of them, less one overhead per loss
    of it. None without history."""
    lo = max(0, end_tick - lookback_ticks)
    if end_tick <= lo:
        return None
    up = [any(r.available[t] >= nodes for r in regions) for t in range(lo, end_tick)]
    losses = sum(1 for a, b in itertools.pairwise(up) if a and not b)
    rate = (sum(up) * gap_s - losses * overhead_s) / (len(up) * gap_s)
    return min(1.0, max(floor, rate))


def simulate_job(market: Market, job: Job, policy: str, *, spot_progress_rate: float = 0.8,
                 region_patience_s: float = 0.0) -> Outcome:
    """One job under one policy (module doc); `spot_progress_rate` feeds `SPOT_THEN_ON_DEMAND`'s rule.
    `region_patience_s`: how long `SPOT_THEN_ON_DEMAND_FAILOVER` waits for spot in the region it last
    ran in before it moves to another, as the control plane does (`SPOTPIPE_REGION_PATIENCE_S`)."""
    if policy not in SIM_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {SIM_POLICIES}")
    return _JobRun(market, job, policy, spot_progress_rate=spot_progress_rate,
                   region_patience_s=region_patience_s).run()


class _JobRun:
    """One job's ticks under one policy: the capacity it holds (type, region), its progress, its bill."""

    def __init__(self, market: Market, job: Job, policy: str, *, spot_progress_rate: float,
                 region_patience_s: float) -> None:
        self.market, self.job, self.policy = market, job, policy
        self.spot_progress_rate, self.region_patience_s = spot_progress_rate, region_patience_s
        self.gap, self.d = market.gap_s, job.overhead_h * 3600
        self.work, self.deadline = job.work_h * 3600, job.deadline_h * 3600
        self.n, self.od_price = job.nodes, market.on_demand_usd_per_hour
        self.out = Outcome(policy, 0.0, self.n * self.od_price * (job.work_h + job.overhead_h), 0.0, False)
        self.kind: str | None = None  # capacity type held
        self.region = 0
        self.last_region: int | None = None  # where the job last ran (the preempted region while it waits)
        self.overhead_left = self.done = 0.0
        self.wanting_since: int | None = None  # the tick it began wanting spot that its own region lacks

    def run(self) -> Outcome:
        for tick in range(self.job.start_tick, self.market.ticks):
            now = (tick - self.job.start_tick) * self.gap
            if self.kind == SPOT and not self.has_spot(self.region, tick):
                self.kind, self.overhead_left = None, 0.0  # preempted: the restart under way is lost too
            if self.policy in (SPOT_THEN_ON_DEMAND, SPOT_THEN_ON_DEMAND_FAILOVER):
                self.follow_the_rule(tick, now)
            elif self.kind is None:
                self.relaunch(tick)
            if self.kind is not None and self.hold(tick, now):
                break
        else:
            self.finish_after_the_trace()
        self.out.met = self.out.finish_h <= self.job.deadline_h + 1e-9
        return self.out

    def launch(self, new_kind: str, new_region: int) -> None:
        if self.last_region is not None and new_region != self.last_region:
            self.out.region_moves += 1
        self.kind, self.region, self.last_region, self.overhead_left = new_kind, new_region, new_region, self.d
        self.out.launches += 1

    def has_spot(self, r: int, tick: int) -> bool:
        return self.market.regions[r].available[tick] >= self.n

    def follow_the_rule(self, tick: int, now: float) -> None:
        """`SPOT_THEN_ON_DEMAND` (spot in the home region) or its failover variant (spot anywhere)."""
        count = len(self.market.regions)
        spot_regions = [0] if self.policy == SPOT_THEN_ON_DEMAND else _failover_order(self.last_region, count)
        choice = choose_capacity_type(
            work_left_s=self.work - self.done + self.overhead_left, time_left_s=self.deadline - now,
            spot_available=any(self.has_spot(r, tick) for r in spot_regions), current=self.kind,
            overhead_s=self.d, spot_progress_rate=self.spot_progress_rate, margin_s=self.gap,
        )
        # Spot elsewhere than where it last ran only after its patience (the control plane's region move).
        here = self.last_region or 0
        if choice.capacity_type != SPOT or self.has_spot(here, tick):
            self.wanting_since = None
        elif self.wanting_since is None:
            self.wanting_since = tick
        patient = self.wanting_since is not None and (tick - self.wanting_since) * self.gap >= self.region_patience_s
        spot_at = next((r for r in spot_regions if self.has_spot(r, tick) and (r == here or patient)), None)
        if choice.capacity_type == ON_DEMAND and self.kind != ON_DEMAND:
            self.launch(ON_DEMAND, 0)
        elif choice.capacity_type == SPOT and self.kind != SPOT and spot_at is not None:
            self.launch(SPOT, spot_at)

    def relaunch(self, tick: int) -> None:
        """The fixed policies, holding nothing: launch where the policy says, if it can."""
        if self.policy == ON_DEMAND:
            self.launch(ON_DEMAND, 0)
        elif self.policy == SPOT:
            if self.has_spot(0, tick):
                self.launch(SPOT, 0)
        else:
            count = len(self.market.regions)
            if self.policy == EAGER_NEXT_REGION and self.last_region is not None:
                order = [(self.last_region + k) % count for k in range(1, count + 1)]
            else:
                order = _failover_order(self.last_region, count)
            target = next((r for r in order if self.has_spot(r, tick)), None)
            if target is not None:
                self.launch(SPOT, target)

    def hold(self, tick: int, now: float) -> bool:
        """Hold the nodes for the tick (the restart overhead first, then work); True when the work is done."""
        price = self.market.regions[self.region].spot_usd_per_hour[tick] if self.kind == SPOT else self.od_price
        lost = min(self.overhead_left, self.gap)
        self.overhead_left -= lost
        useful = self.gap - lost
        held = self.gap
        if self.done + useful >= self.work:
            held = lost + (self.work - self.done)  # the nodes go as soon as the work is done
            self.done = self.work
        else:
            self.done += useful
        self.out.cost_usd += self.n * price * held / 3600
        if self.kind == SPOT:
            self.out.spot_node_hours += self.n * held / 3600
        else:
            self.out.on_demand_node_hours += self.n * held / 3600
        if self.done >= self.work:
            self.out.finish_h = (now + held) / 3600
            return True
        return False

    def finish_after_the_trace(self) -> None:
        """The trace ended first: the rest on on-demand after it (a restart unless already there)."""
        out = self.out
        rest = (self.work - self.done) + (self.overhead_left if self.kind == ON_DEMAND else self.d)
        out.cost_usd += self.n * self.od_price * rest / 3600
        out.on_demand_node_hours += self.n * rest / 3600
        out.finish_h = ((self.market.ticks - self.job.start_tick) * self.gap + rest) / 3600
        out.beyond_trace = True


def _failover_order(last_region: int | None, count: int) -> list[int]:
    """Regions to try for spot: the last one first (home before any), then the next ones in turn."""
    first = last_region or 0
    return [(first + k) % count for k in range(count)]
