"""The discrete-event fleet simulator: a job on a spot cluster under a preemption trace.

Events are membership changes (preemptions and joins), not actions: between two events a strategy's
layout is fixed, so its step time (replayed once per state by `runtime.sim.iteration`) gives the
rate. At each event the strategy decides what the change costs:

* checkpoint: any loss of a working node stops the job, and so does a batch of joiners worth a
  regroup while a slot of the dp x pp grid is empty (the runtime's rule,
  `runtime.distributed.membership.joiners_worth_a_regroup`: enough to fill every empty slot or one
  more full pipeline, or the oldest waited `join_batch_wait_s`; this strategy restarts every
  generation from a checkpoint, written first at that boundary); on a loss the
  work since the last checkpoint is lost (unless the notice lead covers a checkpoint write), then a
  restart (`restart_s`: a rendezvous of the new membership and a reload of the checkpoint) into as
  many full pipelines as the live nodes fill (none: it waits for replacements); checkpoints every
  Young/Daly interval cost `checkpoint_cost_s` each.
* bamboo: the ring predecessor takes a lost node's stage over after `bamboo_failover_s`; a standing-by
  node or a joiner fills a taken-over slot after `join_s` (the runtime's plan fills empty slots,
  spares first); a second loss next to the first (no replica left), or enough spare nodes for one
  more full pipeline, trigger a reconfiguration of `reconfigure_s`. Redundant forwards (and the
  replicas' gradient forwards) slow every failure-free step.
* oobleck: a loss re-instantiates pipelines from the runtime's templates (`reconfigure_s`), and so
  does a batch of joiners worth a regroup (the same rule) while fewer than dp x pp nodes work.
* recycle: a lost node's micro-batches are re-routed to same-stage peers after `recycle_failover_s`
  (no state moves); a joiner fills a hole after `join_s`; a stage with no survivor falls back to a
  reconfiguration.

Every strategy writes periodic checkpoints too (the runtime does, `runtime.checkpointing.durability`, at the
same Young/Daly interval), paying `checkpoint_cost_s` per interval of compute. When a change leaves
no usable plan (fewer live nodes than one pipeline needs, or every copy of some stage gone: a zone
reclaims the fleet; for oobleck, every holder of a layer in its current plan), the job stops, loses
the work since its last checkpoint, waits for replacements, and resumes from that checkpoint after
detection (no notice) and `restart_s`. `SimResult.breakdown` says where the wall time went
(`TIME_BUCKETS`).

Joiners that arrive while checkpoint-restart restarts or oobleck re-instantiates join that regroup
(no pause of their own): Bamboo's simulator, where `RENDEZVOUS_S` comes from, adds a node that
becomes ready during a rendezvous to that rendezvous (`simulate_spot_instance_ready`).

Every strategy except checkpoint loses the step in flight (half a step on average) unless the
notice lead time is at least one step. A node that leaves without notice is noticed after
`detection_s`. Billing counts every live node of the trace at the spot price in force.

`simulate` replays the trace with a `Simulation` (the fleet, the job's bookkeeping `_Run`, the event
loop), one subclass per strategy holding its reactions: `_CheckpointRestart`, `_Oobleck`, and
`_Bamboo` and `_Recycle` (both `_FillsHoles`).
"""

from __future__ import annotations

import abc
import itertools
import math
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.checkpointing.durability import estimated_mtbf_s
from runtime.checkpointing.youngdaly import young_interval
from runtime.config import FAULT_TOLERANT_STRATEGIES, JobConfig
from runtime.distributed.membership import joiners_worth_a_regroup
from runtime.sim.iteration import IterationModel
from runtime.sim.plans import Pattern
from runtime.sim.prices import PriceSeries
from runtime.strategies import get_strategy
from runtime.traces import ADD, Trace, TraceEvent

STRATEGIES = FAULT_TOLERANT_STRATEGIES  # what the simulator compares (runtime/config.py owns the names)

RENDEZVOUS_S = 30.0
"""Bamboo's own simulator (uclasystem/bamboo, project_pactum/simulation/simulator.py,
`global_rendezvous_timeout_delta`): 30 s for the members of a new generation to meet."""
NODE_READY_S = 45.0
"""The same simulator's `spot_instance_creation_time`: a new spot instance is ready 45 s after it
is granted."""
CHECKPOINT_BYTES_PER_PARAM_BYTE = 3.0
"""A checkpoint holds the weights and AdamW's two moments (`runtime.checkpointing.checkpoints`)."""
STORAGE_GBPS = 1.5
"""Write/read bandwidth of one node to durable storage: p3.2xlarge's dedicated EBS bandwidth
(AWS instance-type table, 1.5 Gbps); a checkpoint's writers (one per stage) write in parallel."""


TIME_BUCKETS = ("training", "redone", "checkpointing", "restarting", "waiting")
"""Where a run's wall time goes (`SimResult.breakdown`; the buckets sum to the trace's duration):
* training: computing steps whose samples were kept (at the strategy's own, possibly degraded,
  step time: redundant forwards, fewer pipelines, re-routed holes all show here as a rate, see
  `failure_free_equivalent_hours` in the summary);
* redone: computing steps whose samples were lost (the step in flight, the work since the last
  checkpoint) and so had to be computed again;
* checkpointing: writing periodic checkpoints (and checkpoint-restart's save on a notice or a grow);
* restarting: paused for a change: failure detection, failover, re-routing, reconfiguration, the
  restart from a checkpoint (rendezvous + reload);
* waiting: no usable plan (too few live nodes): waiting for replacements."""


def checkpoint_write_s(param_bytes: float, *, writers: int, storage_gbps: float = STORAGE_GBPS) -> float:
    """Seconds to write one checkpoint: each of `writers` writes its equal share of the weights and
    optimizer state at the storage bandwidth."""
    return CHECKPOINT_BYTES_PER_PARAM_BYTE * param_bytes / max(writers, 1) / (storage_gbps * 1e9 / 8)


@dataclass(kw_only=True, slots=True)
class SimParams:
    """Costs of reacting to a change, in seconds, and the market."""

    checkpoint_cost_s: float = 30.0
    """Time to write one checkpoint (training pauses). A prior: `checkpoint_write_s` derives it from
    the job's bytes and the storage bandwidth (the benchmark does)."""
    rendezvous_s: float = RENDEZVOUS_S
    """A restart's rendezvous: every member of the new generation joins before training resumes."""
    restart_s: float | None = None
    """Restart from a checkpoint: the rendezvous plus a reload of what one write wrote (same bytes,
    same storage); None derives it as `rendezvous_s + checkpoint_cost_s`."""
    checkpoint_interval_s: float = 0.0
    """Compute seconds between checkpoints; 0 = Young's sqrt(2 C MTBF) as the runtime sets it:
    checkpoint-restart from the trace's whole-fleet rate (it restarts on every loss); the others
    from the runtime's estimate (`runtime.checkpointing.durability.estimated_mtbf_s`: `mtbf_prior_s`, pulled down
    by each loss that needed the checkpoint), recomputed at each such loss."""
    mtbf_prior_s: float = field(default_factory=lambda: JobConfig.__dataclass_fields__["mtbf_s"].default)
    """The runtime's prior mean time between failures that need a checkpoint (`JobConfig.mtbf_s`)."""
    join_batch_wait_s: float = field(
        default_factory=lambda: JobConfig.__dataclass_fields__["join_batch_wait_s"].default)
    """checkpoint/oobleck: the longest a joiner waits for a batch worth a regroup
    (`JobConfig.join_batch_wait_s`, the runtime's rule `joiners_worth_a_regroup`)."""
    checkpoint_every_strategy: bool = True
    """Every strategy writes periodic checkpoints (the runtime does); False: checkpoint-restart only."""
    bamboo_failover_s: float = 10.0
    """bamboo: the ring predecessor takes a lost stage over. No source (Bamboo's simulator pauses
    for none: its steps run 1.5x slower until the next reconfiguration)."""
    reconfigure_s: float = 30.0
    """bamboo/oobleck/recycle: rebuild groups and move the state of re-placed layers. Bamboo's
    simulator's global rendezvous (`RENDEZVOUS_S`); no Oobleck or ReCycle figure was found."""
    recycle_failover_s: float = 2.0
    join_s: float = 1.0
    """recycle: a replacement copies its stage from a peer in the background, then fills a hole at a
    step boundary (the job pauses only for the switch). Neither has a source; the runtime's own
    kill -> next commit and replacement ready -> first commit at 8 ranks on localhost are in
    docs/runtime.md's figures table (`python -m bench runtime`), well under both."""
    detection_s: float = 5.0
    """A node that leaves without (enough) notice is declared dead after this long."""
    notice_s: float = 0.0
    """Lead time of preemption notices (AWS gives 120 s; the public traces carry none)."""
    replacement_delay_s: float = 0.0
    """Extra delay added to every join after the start (slower capacity acquisition)."""
    node_ready_s: float = NODE_READY_S
    """A node that joins after the start works only this long after the trace adds it (boot,
    image, processes); it is billed from the trace's time."""
    spot_price: PriceSeries = field(default_factory=lambda: PriceSeries.constant(0.918))
    """USD per node-hour over the trace (default: p3.2xlarge spot, about 30% of on-demand)."""
    on_demand_usd_per_hour: float = 3.06

    @property
    def restart_total_s(self) -> float:
        return self.restart_s if self.restart_s is not None else self.rendezvous_s + self.checkpoint_cost_s


@dataclass(slots=True)
class SimResult:
    strategy: str
    duration_s: float
    total_samples: float
    dollars: float
    failure_free_samples_per_s: float
    on_demand_dollars_per_sample: float
    series: list[tuple[float, float]]
    """(time, cumulative samples) at every change of rate."""
    events: int
    pauses_s: float
    lost_samples: float
    samples_target: float | None = None
    finish_s: float | None = None
    checkpoint_interval_s: float | None = None
    restores: int = 0
    """Times the job lost every usable plan and resumed from its last checkpoint."""
    joiner_regroups: int = 0
    """checkpoint/oobleck: regroups started for a batch of joiners (`joiners_worth_a_regroup`), not
    counting joiners taken into a regroup already under way."""
    down_s: float = 0.0
    """Seconds with no usable plan (waiting for replacements)."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """Where the trace's wall time went (`TIME_BUCKETS`, seconds; they sum to `duration_s`)."""

    @property
    def samples_per_s(self) -> float:
        return self.total_samples / self.duration_s if self.duration_s else 0.0

    @property
    def samples_per_dollar(self) -> float:
        return self.total_samples / self.dollars if self.dollars else 0.0

    def summary(self) -> dict:
        """JSON-ready figures (the series is left to `binned_rate`)."""
        spot_per_sample = self.dollars / self.total_samples if self.total_samples else math.inf
        return {
            "strategy": self.strategy,
            "simulated_hours": round(self.duration_s / 3600, 3),
            "total_samples": round(self.total_samples),
            "samples_per_s": self.samples_per_s,
            "failure_free_samples_per_s": self.failure_free_samples_per_s,
            "throughput_relative_to_failure_free": self.samples_per_s / self.failure_free_samples_per_s,
            "dollars": round(self.dollars, 2),
            "samples_per_dollar": self.samples_per_dollar,
            "dollars_per_sample": spot_per_sample,
            "cost_per_sample_relative_to_on_demand": spot_per_sample / self.on_demand_dollars_per_sample,
            "membership_events": self.events,
            "paused_hours": round(min(self.pauses_s, self.duration_s) / 3600, 3),
            "lost_samples": round(self.lost_samples),
            "samples_target": self.samples_target,
            "time_to_finish_hours": None if self.finish_s is None else round(self.finish_s / 3600, 3),
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "restores_from_checkpoint": self.restores,
            "joiner_regroups": self.joiner_regroups,
            "hours_without_a_plan": round(self.down_s / 3600, 3),
            "time_breakdown_hours": {k: round(v / 3600, 4) for k, v in self.breakdown.items()},
            "failure_free_equivalent_hours": round(self.total_samples / self.failure_free_samples_per_s / 3600, 4),
        }

    def binned_rate(self, bins: int = 200) -> list[tuple[float, float]]:
        """(bin start time, samples/s in the bin) from the cumulative series."""
        if not self.series or self.duration_s <= 0:
            return []
        width = self.duration_s / bins
        out = []
        for b in range(bins):
            a, z = b * width, (b + 1) * width
            out.append((a, max(0.0, (self._cumulative(z) - self._cumulative(a)) / width)))
        return out

    def _cumulative(self, t: float) -> float:
        import bisect

        times = [p[0] for p in self.series]
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return 0.0
        t0, s0 = self.series[i]
        if i + 1 < len(self.series):
            t1, s1 = self.series[i + 1]
            return s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else s1
        return s0


class _Run:
    """Shared bookkeeping: progress at a rate, pauses, losses, periodic checkpoints, the series."""

    def __init__(self, samples_per_step: float, *, duty: float = 1.0, interval_s: float = math.inf) -> None:
        self.samples_per_step = samples_per_step
        self.t = 0.0
        self.samples = 0.0
        self.step_s = math.inf
        self.resume_at = 0.0
        self.series: list[tuple[float, float]] = [(0.0, 0.0)]
        self.pauses = 0.0
        self.lost = 0.0
        self.target: float | None = None
        self.finish: float | None = None
        self.duty = duty
        """Share of time training (the rest writes periodic checkpoints)."""
        self.interval_s = interval_s
        self.since_checkpoint_s = 0.0
        """Compute seconds since the last complete checkpoint."""
        self.checkpointed = 0.0
        """Samples in the last complete checkpoint."""
        self.restores = 0
        self.joiner_regroups = 0
        self.down_since: float | None = None
        self.down_s = 0.0
        self.spent = dict.fromkeys(TIME_BUCKETS, 0.0)
        """Wall seconds per bucket up to `t` (`TIME_BUCKETS`)."""

    @property
    def raw_rate(self) -> float:
        return self.samples_per_step / self.step_s if self.step_s < math.inf else 0.0

    @property
    def rate(self) -> float:
        return self.raw_rate * self.duty

    def redo(self, seconds: float) -> None:
        """`seconds` of training produced samples that were lost: they move to the redone bucket."""
        seconds = min(max(seconds, 0.0), self.spent["training"])
        self.spent["training"] -= seconds
        self.spent["redone"] += seconds

    def account(self, t: float) -> None:
        """Put the wall time from `self.t` to `t` in its buckets (down, paused, or running: its
        training and checkpoint-writing shares)."""
        if t <= self.t:
            return
        if self.down_since is not None:
            self.spent["waiting"] += t - self.t
            return
        paused_until = min(t, max(self.t, self.resume_at))
        self.spent["restarting"] += paused_until - self.t
        running = t - paused_until
        if self.rate > 0:
            self.spent["training"] += running * self.duty
            self.spent["checkpointing"] += running * (1.0 - self.duty)
        else:
            self.spent["waiting"] += running

    def advance(self, t: float) -> None:
        self.account(t)
        start = max(self.t, self.resume_at)
        if t > start and self.rate > 0:
            if self.target is not None and self.finish is None:
                need = self.target - self.samples
                if need <= (t - start) * self.rate:
                    self.finish = start + need / self.rate
            if self.series[-1][0] < start:
                self.series.append((start, self.samples))
            self.samples += (t - start) * self.rate
            self.series.append((t, self.samples))
            self.since_checkpoint_s += (t - start) * self.duty
            if self.since_checkpoint_s >= self.interval_s:
                self.since_checkpoint_s %= self.interval_s
                self.checkpointed = self.samples - self.since_checkpoint_s * self.raw_rate
        self.t = max(self.t, t)

    def pause(self, seconds: float) -> None:
        end = max(self.resume_at, self.t) + seconds
        self.pauses += end - max(self.resume_at, self.t)
        self.resume_at = end

    def lose_in_flight(self, params: SimParams) -> None:
        """Half a step on average is redone, unless the notice lets the step finish first."""
        if params.notice_s >= self.step_s or self.rate == 0 or self.t < self.resume_at:
            return
        lost = min(0.5 * self.samples_per_step, self.samples - self.checkpointed)
        self.samples -= lost
        self.lost += lost
        seconds = lost / self.raw_rate
        self.redo(seconds)
        self.since_checkpoint_s = max(0.0, self.since_checkpoint_s - seconds)

    def react(self, params: SimParams, seconds: float, *, loss: bool) -> None:
        """Pause for a change: the reaction itself, plus failure detection when a node left
        without notice (with a notice the job learns of the loss before it happens)."""
        self.pause((params.detection_s if loss and params.notice_s <= 0 else 0.0) + seconds)

    def stop(self, t: float) -> None:
        """No usable plan: the state since the last checkpoint is gone; wait for nodes."""
        if self.down_since is not None:
            return
        self.lost += self.samples - self.checkpointed
        self.redo(self.since_checkpoint_s)
        self.samples = self.checkpointed
        self.series.append((t, self.samples))
        self.since_checkpoint_s = 0.0
        self.step_s = math.inf
        self.resume_at = max(self.resume_at, t)
        self.down_since = t

    def resume(self, t: float, params: SimParams) -> None:
        """A plan is possible again: restart from the last checkpoint (rendezvous + reload)."""
        if self.end_down(t):
            self.resume_at = t
            self.pause(params.restart_total_s)

    def end_down(self, t: float) -> bool:
        """Leave the down state at t (a restore from the checkpoint); False when the job was not down."""
        if self.down_since is None:
            return False
        self.down_s += t - self.down_since
        self.down_since = None
        self.restores += 1
        return True

    def finish_down(self, t: float) -> None:
        if self.down_since is not None:
            self.down_s += t - self.down_since


def simulate(
    trace: Trace,
    *,
    strategy: str,
    model: IterationModel,
    params: SimParams | None = None,
    samples_per_microbatch: int = 1,
    samples_target: float | None = None,
) -> SimResult:
    """Replay `trace` for one strategy and return what the job achieved and paid."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is unknown; expected one of {STRATEGIES}")
    simulation = _SIMULATIONS[strategy](
        trace,
        model=model,
        params=params or SimParams(),
        samples_per_microbatch=samples_per_microbatch,
        samples_target=samples_target,
    )
    return simulation.replay()


class Simulation(abc.ABC):
    """One replay of a trace for one strategy: the fleet (live nodes, the dp x pp slot grid), the job's
    bookkeeping (`_Run`) and the event loop. Each subclass is one strategy's reactions to a change
    (`on_change`); what the strategy objects say of themselves (`runtime.strategies.base.Strategy`) is
    read from `traits`."""

    name: str
    """The strategy simulated (a `runtime.strategies` name)."""

    def __init__(
        self,
        trace: Trace,
        *,
        model: IterationModel,
        params: SimParams,
        samples_per_microbatch: int = 1,
        samples_target: float | None = None,
    ) -> None:
        self.trace, self.model, self.params = trace, model, params
        self.traits = get_strategy(self.name)
        self.dp, self.pp = model.dp, model.pp
        self.wanted = self.dp * self.pp
        self.samples_per_step = model.total_microbatches * samples_per_microbatch
        self.failure_free = self.samples_per_step / model.full_pipelines(self.dp)
        # A strategy that restarts from a checkpoint on every change writes its checkpoints inside its
        # restart segments; every other one pays its periodic writes as a share of its time.
        self.periodic = not self.traits.restarts_from_checkpoint and params.checkpoint_every_strategy
        self.interval = _first_checkpoint_interval(trace, params, nodes=self.wanted, periodic=self.periodic)
        """The checkpoint interval the run starts with (`SimResult.checkpoint_interval_s`)."""
        duty = self.interval / (self.interval + params.checkpoint_cost_s) if self.periodic else 1.0
        self.run = _Run(self.samples_per_step, duty=duty, interval_s=self.interval if self.periodic else math.inf)
        self.run.target = samples_target
        self.needed_checkpoint = 0
        """Losses that took every copy of some layer (the runtime's "failures")."""
        self.events, self.billed = _worked_and_billed(trace, params)
        self.live: list[str] = []
        self.live_set: set[str] = set()
        self.ready_at: dict[str, float] = {}
        """When each live node joined (its wait for a batch starts there)."""
        self.cancelled: set[str] = set()
        self.slots: list[list[str | None]] = []
        """slots[p][s]: the node working stage s of pipeline p, None where it was lost; spares hold the rest."""
        self.where: dict[str, tuple[int, int]] = {}

    # -- the event loop ---------------------------------------------------------------------------
    def replay(self) -> SimResult:
        """Every batch of simultaneous membership changes in turn, then the end of the trace."""
        for t, batch in itertools.groupby(self.events, key=lambda e: e.t_s):
            self.on_events(t, list(batch))
        end = self.trace.duration_s
        self.take_joiners_due_by(end, inclusive=False)
        self.settle(end)
        return self.result()

    def on_events(self, t: float, batch: list[TraceEvent]) -> None:
        """The changes at t, after the regroups for held joiners whose wait bound passed by then."""
        self.take_joiners_due_by(t, inclusive=True)
        self.advance(t)
        added, removed = self.apply(batch, t)
        hit = [n for n in removed if n in self.where]
        if t == 0:
            self.start()
        else:
            self.on_change(t, added, removed, hit)

    def advance(self, t: float) -> None:
        """Train at the current rate up to t."""
        self.run.advance(t)

    def apply(self, batch: list[TraceEvent], t: float) -> tuple[list[str], list[str]]:
        """Take the batch into the live nodes; (added, removed): the nodes that count."""
        removed = [e.node for e in batch if e.kind != ADD and e.node in self.live_set]
        # A node reclaimed before it was ready (its join delayed past the removal) never works.
        self.cancelled.update(e.node for e in batch if e.kind != ADD and e.node not in self.live_set)
        added = [
            e.node for e in batch if e.kind == ADD and e.node not in self.live_set and e.node not in self.cancelled
        ]
        for node in removed:
            self.live_set.discard(node)
            self.live.remove(node)
        for node in added:
            self.live_set.add(node)
            self.live.append(node)
            self.ready_at[node] = t
        return added, removed

    def start(self) -> None:
        """The trace's first nodes: lay the job out, or wait for more if no plan fits them."""
        self.lay_out()
        self.run.step_s = self.step_time()
        if self.run.step_s == math.inf:
            self.wait_for_nodes(0.0)

    @abc.abstractmethod
    def on_change(self, t: float, added: list[str], removed: list[str], hit: list[str]) -> None:
        """Nodes `added` and `removed` at t (`hit`: the removed ones that held a slot)."""

    def settle(self, end: float) -> None:
        """Close the books at the end of the trace."""
        self.run.advance(end)
        self.run.finish_down(end)
        self.run.account(end)

    def result(self) -> SimResult:
        run, end = self.run, self.trace.duration_s
        node_series = Trace(name="billed", events=self.billed, duration_s=end).node_count_series()
        dollars = self.params.spot_price.cost_of_nodes(node_series, end)
        on_demand_per_sample = self.wanted * self.params.on_demand_usd_per_hour / 3600.0 / self.failure_free
        return SimResult(
            strategy=self.name,
            duration_s=end,
            total_samples=run.samples,
            dollars=dollars,
            failure_free_samples_per_s=self.failure_free,
            on_demand_dollars_per_sample=on_demand_per_sample,
            series=run.series,
            events=len(self.events),
            pauses_s=run.pauses,
            lost_samples=run.lost,
            samples_target=run.target,
            finish_s=run.finish,
            checkpoint_interval_s=self.interval,
            restores=run.restores,
            joiner_regroups=run.joiner_regroups,
            down_s=run.down_s,
            breakdown=dict(run.spent),
        )

    # -- the layout -------------------------------------------------------------------------------
    def form(self) -> None:
        """Re-form full pipelines from all live nodes (a restart or a reconfiguration)."""
        live, pp, where = self.live, self.pp, self.where  # locals: this runs at every restart of a big fleet
        self.slots = [[live[p * pp + s] for s in range(pp)] for p in range(min(self.dp, len(live) // pp))]
        where.clear()
        for p, row in enumerate(self.slots):
            for s, node in enumerate(row):
                where[node] = (p, s)

    def lay_out(self) -> None:
        """Lay the job out afresh on every live node (at the start, after a restore, when down)."""
        self.form()

    def working(self) -> int:
        return sum(1 for row in self.slots for n in row if n is not None)

    def pattern(self) -> Pattern:
        return tuple(tuple(n is not None for n in row) for row in self.slots)

    def step_time(self) -> float:
        """Seconds per step of the strategy's plan for the current slots (inf: no plan)."""
        if not self.slots:
            return math.inf
        return self.model.step(self.name, self.pattern())

    # -- joiners held for a batch (`Strategy.batches_joiners`) ------------------------------------
    def placed(self) -> Collection[str]:
        """The nodes of the current generation; a live node outside it is a joiner held for a batch."""
        return self.where

    def held_joiners(self) -> tuple[list[str], int]:
        """The live nodes waiting outside the generation, and the slots filled."""
        placed = self.placed()
        return [n for n in self.live if n not in placed], len(placed)

    def joiners_due(self, t: float) -> bool:
        """The runtime's rule: are the waiting joiners worth a regroup at t?"""
        waiting, filled = self.held_joiners()
        return joiners_worth_a_regroup(
            self.name, pp=self.pp, filled=filled, empty=self.wanted - filled, waiting=len(waiting),
            waited_s=t - min((self.ready_at[n] for n in waiting), default=t),
            wait_bound_s=self.params.join_batch_wait_s, urgent=not self.slots)

    def batch_deadline(self) -> float | None:
        """When the oldest joiner held for a batch will have waited `join_batch_wait_s` (None: none held)."""
        if not self.traits.batches_joiners or not self.slots or self.run.down_since is not None:
            return None
        waiting, filled = self.held_joiners()
        if not waiting or filled >= self.wanted:
            return None
        return min(self.ready_at[n] for n in waiting) + self.params.join_batch_wait_s

    def take_joiners_due_by(self, t: float, *, inclusive: bool) -> None:
        """Regroup for the held joiners each time their wait bound passes before t (or at t: `inclusive`)
        and the runtime's rule says they are worth it then."""
        while (due := self.batch_deadline()) is not None and (due <= t if inclusive else due < t):
            if not self.joiners_due(due):
                return
            self.run.joiner_regroups += 1
            self.regroup_for_joiners(due)

    def regroup_for_joiners(self, t: float) -> None:
        """The bound passed: the job regroups for the joiners it held. Only strategies whose
        `batches_joiners` trait is set hold any (`batch_deadline`); the others take every joiner at
        once and never get here."""
        raise AssertionError(f"{self.name} takes every joiner at once: no batch to regroup for")

    # -- losses -----------------------------------------------------------------------------------
    def follow_the_runtimes_interval(self, t: float) -> None:
        """After a loss that needed the checkpoint, the interval the runtime's next plan carries."""
        self.needed_checkpoint += 1
        if not self.periodic or self.params.checkpoint_interval_s > 0:
            return
        mtbf = estimated_mtbf_s(self.params.mtbf_prior_s, t, self.needed_checkpoint)
        self.run.interval_s = young_interval(checkpoint_cost_s=self.params.checkpoint_cost_s, mtbf_s=mtbf)
        self.run.duty = self.run.interval_s / (self.run.interval_s + self.params.checkpoint_cost_s)

    def lose_state(self, t: float, *, hit: bool) -> None:
        """No usable plan is left: stop (unless down already) and lose the work since the checkpoint."""
        if self.run.down_since is not None:
            return
        if hit:
            self.run.lose_in_flight(self.params)
        self.follow_the_runtimes_interval(t)
        self.run.stop(t)

    def wait_for_nodes(self, t: float) -> None:
        """Nothing can run: wait for replacements from t."""
        if self.run.down_since is None:
            self.run.down_since = t

    def step_or_stop(self, t: float) -> bool:
        """The step time of the new layout; False (and the job stops) when it has no plan."""
        self.run.step_s = self.step_time()
        if self.run.step_s == math.inf:
            self.lose_state(t, hit=False)
            return False
        return True

    def resume_if_a_plan_exists(self, t: float) -> bool:
        """Re-form on every live node; when a plan exists, resume from the checkpoint (True)."""
        self.lay_out()
        self.run.step_s = self.step_time()
        if self.run.step_s < math.inf:
            self.run.resume(t, self.params)
            return True
        return False

    def restore_from_checkpoint(self, t: float) -> None:
        """A loss took every copy of some layer: stop, re-form on who is left, resume from the
        checkpoint when a plan exists again (else wait for replacements)."""
        self.lose_state(t, hit=True)
        if self.resume_if_a_plan_exists(t):
            self.run.react(self.params, 0.0, loss=True)  # the loss is detected first, as for any other reaction


class _CheckpointRestart(Simulation):
    """checkpoint: every regroup restarts the job from a checkpoint, so its time is a chain of
    segments, each a pause (a save, detection, the restart) and then cycles of compute and checkpoint
    writes; its progress is read off the current segment (`progress`), not advanced event by event."""

    name = "checkpoint"

    def __init__(self, trace: Trace, **kwargs: Any) -> None:
        super().__init__(trace, **kwargs)
        self.committed = 0.0
        """Samples in the last checkpoint the current segment started from."""
        self.segment_start = 0.0
        self.pause_from = 0.0
        """When the current segment's pause (save, restart) began ..."""
        self.save_s = 0.0
        """... and how much of that pause writes a checkpoint (the rest restarts)."""
        self.members: set[str] = set()
        """The generation's members, its pipelines' nodes and the standing-by nodes that fill the rest
        of the dp x pp slots (`CheckpointStrategy`: standby members of the layout, in the group's
        commit); live nodes beyond are spares outside the group."""

    def form(self) -> None:
        super().form()
        self.members = set(self.live[: self.wanted])

    def placed(self) -> Collection[str]:
        return self.members

    def step_time(self) -> float:
        return self.model.full_pipelines(len(self.slots))  # its slots are full pipelines, always

    def advance(self, t: float) -> None:
        """Nothing to do: the segment says what was trained by any time."""

    def wait_for_nodes(self, t: float) -> None:
        super().wait_for_nodes(t)
        self.segment_start = math.inf

    def on_change(self, t: float, added: list[str], removed: list[str], hit: list[str]) -> None:
        # A batch of joiners worth a regroup while a slot of the dp x pp grid is empty
        # (`joiners_worth_a_regroup`) ends the runtime's generation at the next step boundary, and
        # this strategy restarts every generation from a checkpoint, written first at that boundary.
        room = bool(added) and len(self.members) < self.wanted
        # A standing-by member's loss fails the generation's commit like a working node's.
        lost_member = [n for n in removed if n in self.members]
        if room and not lost_member and self.slots and t < self.segment_start:
            self.form()  # joiners during a restart join it (module notes): same pause, more pipelines
        elif lost_member or (room and self.joiners_due(t)):
            self.run.joiner_regroups += not lost_member
            self.restart(t, save_first=not lost_member or self.params.notice_s >= self.params.checkpoint_cost_s)

    def regroup_for_joiners(self, t: float) -> None:
        self.restart(t, save_first=True)

    def restart(self, t: float, *, save_first: bool) -> None:
        """End the segment at t (saving first when asked and something runs, else losing what the last
        checkpoint does not hold), re-form on every live node and start the next segment after the
        pause, or wait for replacements when no pipeline can be filled (the next join restarts)."""
        saving = save_first and bool(self.slots)
        pause = self.end_segment(t, saving=saving)
        self.form()
        if not self.slots:
            self.wait_for_nodes(t)
            return
        self.run.end_down(t)
        self.start_segment(t, pause=pause, save_s=pause if saving else 0.0)

    def end_segment(self, t: float, *, saving: bool) -> float:
        """Close the current segment at t; the pause it adds before the restart (the save, or the
        detection of a loss without notice)."""
        had_slots = bool(self.slots)
        done, pending = self.progress(t)
        self.account_segment(t, losing=not saving)
        if saving:
            self.committed = done + pending
            pause = self.params.checkpoint_cost_s
        else:
            self.committed = done
            self.run.lost += pending
            pause = self.params.detection_s if had_slots and self.params.notice_s <= 0 else 0.0
        self.run.series.append((t, done + pending))
        self.run.series.append((t, self.committed))
        return pause

    def start_segment(self, t: float, *, pause: float, save_s: float) -> None:
        """The next segment trains from `pause` plus the restart after t, from the last checkpoint."""
        self.segment_start = t + pause + self.params.restart_total_s
        self.pause_from, self.save_s = t, save_s
        self.run.pauses += pause + self.params.restart_total_s
        self.run.series.append((self.segment_start, self.committed))
        self.run.samples = self.committed

    def cycles(self, s: float) -> tuple[int, float]:
        """(complete compute + write cycles, seconds into the next one) `s` seconds into a segment."""
        cycle = self.interval + self.params.checkpoint_cost_s
        k = math.floor(s / cycle)
        return k, s - k * cycle

    def progress(self, t: float) -> tuple[float, float]:
        """(committed, produced-but-uncommitted) samples of the current segment at time t."""
        if not self.slots:
            return self.committed, 0.0
        rate = self.samples_per_step / self.model.full_pipelines(len(self.slots))
        k, phase = self.cycles(max(0.0, t - self.segment_start))
        return self.committed + k * self.interval * rate, min(phase, self.interval) * rate

    def account_segment(self, t: float, *, losing: bool) -> None:
        """The wall time of the current segment up to t, in its buckets (the pause: its checkpoint
        save, then detection and restart; then cycles of compute and writes; `losing`: the compute
        since the last complete write is redone)."""
        if self.segment_start == math.inf or t <= self.pause_from:
            return
        spent = self.run.spent
        paused = min(t, self.segment_start) - self.pause_from
        spent["checkpointing"] += min(paused, self.save_s)
        spent["restarting"] += paused - min(paused, self.save_s)
        if t <= self.segment_start:
            return
        k, phase = self.cycles(t - self.segment_start)
        spent["training"] += k * self.interval + min(phase, self.interval)
        spent["checkpointing"] += k * self.params.checkpoint_cost_s + max(0.0, phase - self.interval)
        if losing:
            self.run.redo(min(phase, self.interval))

    def settle(self, end: float) -> None:
        run = self.run
        done, pending = self.progress(end)
        run.samples = done + pending
        self.account_segment(end, losing=False)
        # The cumulative series is linear within each segment: its points are the restarts and the end.
        run.series.append((end, run.samples))
        if run.target is not None and run.samples >= run.target:
            run.finish = _first_crossing(run.series, run.target)
        run.finish_down(end)
        run.spent["waiting"] += run.down_s  # the segments account for every other second


class _ReactsWhileUp(Simulation):
    """Strategies that react to each change while the job runs, and re-form once a plan is possible
    again after the job went down (every strategy but checkpoint-restart, whose segments decide)."""

    def on_change(self, t: float, added: list[str], removed: list[str], hit: list[str]) -> None:
        if self.run.down_since is not None:
            # Down: re-form from every live node as soon as some plan is possible again.
            self.resume_if_a_plan_exists(t)
            return
        self.react(t, added, hit)

    @abc.abstractmethod
    def react(self, t: float, added: list[str], hit: list[str]) -> None:
        """The strategy's reaction to a change while the job runs."""


class _Oobleck(_ReactsWhileUp):
    """oobleck: a loss re-instantiates the pipelines from the runtime's templates, and so does a batch
    of joiners worth a regroup while fewer than dp x pp nodes work; a loss that takes every holder of
    some layer of its plan falls back to the checkpoint."""

    name = "oobleck"

    def lay_out(self) -> None:
        """Oobleck keeps no fixed grid: the first dp x pp live nodes work, as one flat row."""
        self.where.clear()
        row: list[str | None] = list(self.live[: self.wanted])
        for i, node in enumerate(row):
            self.where[node] = (0, i)
        self.slots = [row]

    def step_time(self) -> float:
        return self.model.oobleck(self.working()) if self.working() else math.inf

    def react(self, t: float, added: list[str], hit: list[str]) -> None:
        if hit and self.layer_lost(hit):
            self.restore_from_checkpoint(t)
            return
        # A batch of joiners worth a regroup while fewer than dp x pp nodes work ends the runtime's
        # generation, and oobleck re-instantiates its pipelines over every live node (one pause for
        # the batch, not one each); joiners during a re-instantiation join it (module notes).
        room = bool(added) and self.working() < self.wanted
        if not (hit or (room and (t < self.run.resume_at or self.joiners_due(t)))):
            return
        self.run.joiner_regroups += not hit and t >= self.run.resume_at
        if hit:
            self.run.lose_in_flight(self.params)
        self.lay_out()
        if self.step_or_stop(t) and (hit or t >= self.run.resume_at):
            self.run.react(self.params, self.params.reconfigure_s, loss=bool(hit))

    def regroup_for_joiners(self, t: float) -> None:
        self.run.advance(t)
        self.lay_out()
        self.run.step_s = self.step_time()
        if t >= self.run.resume_at:
            self.run.react(self.params, self.params.reconfigure_s, loss=False)

    def layer_lost(self, gone: list[str]) -> bool:
        """Whether `gone` took every holder of some layer in oobleck's current plan (its pipelines
        hold every layer once each; a spare holds none)."""
        row = self.slots[0] if self.slots else []
        held = self.model.oobleck_layers(len(row))
        everything = frozenset().union(*held)
        kept = frozenset().union(*(layers for node, layers in zip(row, held, strict=True) if node not in gone))
        return kept != everything


class _FillsHoles(_ReactsWhileUp):
    """bamboo and recycle: the survivors cover a lost node's slot after `failover_s`; a standing-by
    node or a joiner fills the hole after `join_s` (the runtime's plan fills empty slots, spares
    first: `runtime.distributed.membership.make_plan`), copying its state in the background; enough
    spare nodes for one more full pipeline trigger a reconfiguration, and so does a loss the strategy
    cannot cover (`no_cover_left`)."""

    @property
    @abc.abstractmethod
    def failover_s(self) -> float:
        """Seconds until the survivors cover a lost node's slot."""

    def no_cover_left(self, p: int, s: int) -> bool:
        """Whether the loss of slot (p, s), now empty, leaves a stage of its pipeline uncovered."""
        return False

    def copies_of(self, s: int) -> list[str | None]:
        """The nodes that hold stage s's state."""
        return [row[s] for row in self.slots]

    def react(self, t: float, added: list[str], hit: list[str]) -> None:
        reconfigure = self.vacate(hit)
        if hit and self.stage_lost():
            self.restore_from_checkpoint(t)
            return
        if hit:
            self.run.lose_in_flight(self.params)
        filled = 0
        if not reconfigure:
            filled, spares = self.fill_holes()
            reconfigure = len(self.slots) < self.dp and spares - filled >= self.pp
        if reconfigure:
            self.form()
            self.run.react(self.params, self.params.reconfigure_s, loss=bool(hit))
        elif hit:
            self.run.react(self.params, self.failover_s + (self.params.join_s if filled else 0.0), loss=True)
        elif filled:
            self.run.pause(self.params.join_s)
        self.step_or_stop(t)

    def vacate(self, hit: list[str]) -> bool:
        """Empty the lost nodes' slots; True when one of the losses needs a reconfiguration."""
        reconfigure = False
        for node in hit:
            p, s = self.where.pop(node)
            self.slots[p][s] = None
            if self.no_cover_left(p, s):
                reconfigure = True
        return reconfigure

    def fill_holes(self) -> tuple[int, int]:
        """Put the spare live nodes into the empty slots, first pipeline first; (filled, spares)."""
        holes = [(p, s) for p, row in enumerate(self.slots) for s, n in enumerate(row) if n is None]
        spare_nodes = [n for n in self.live if n not in self.where]
        filled = 0
        for (p, s), node in zip(holes, spare_nodes, strict=False):
            self.slots[p][s] = node
            self.where[node] = (p, s)
            filled += 1
        return filled, len(spare_nodes)

    def stage_lost(self) -> bool:
        """Whether some stage has no copy left on a working node. The runtime then restores from the
        last checkpoint (`Strategy.falls_back_to_checkpoint`)."""
        if not self.slots:
            return True
        return any(all(n is None for n in self.copies_of(s)) for s in range(self.pp))


class _Bamboo(_FillsHoles):
    """bamboo: the ring predecessor, which keeps a replica of a node's stage, takes it over."""

    name = "bamboo"

    @property
    def failover_s(self) -> float:
        return self.params.bamboo_failover_s

    def no_cover_left(self, p: int, s: int) -> bool:
        # Consecutive losses: no replica left for one of the stages.
        row = self.slots[p]
        return row[(s - 1) % self.pp] is None or row[(s + 1) % self.pp] is None or all(n is None for n in row)

    def copies_of(self, s: int) -> list[str | None]:
        return super().copies_of(s) + [row[(s - 1) % self.pp] for row in self.slots]


class _Recycle(_FillsHoles):
    """recycle: a lost node's micro-batches are re-routed to same-stage peers (no state moves)."""

    name = "recycle"

    @property
    def failover_s(self) -> float:
        return self.params.recycle_failover_s


_SIMULATIONS: dict[str, type[Simulation]] = {cls.name: cls for cls in (_CheckpointRestart, _Bamboo, _Recycle, _Oobleck)}


def _first_checkpoint_interval(trace: Trace, params: SimParams, *, nodes: int, periodic: bool) -> float:
    """The checkpoint interval a run starts with: `checkpoint_interval_s` when set, else Young's, from
    the trace's whole-fleet rate (checkpoint-restart restarts on every loss) or, for a periodic
    writer, from the runtime's prior (`mtbf_prior_s`)."""
    rate_per_node_s = trace.preemption_rate() / 3600.0
    interval = params.checkpoint_interval_s
    if interval <= 0:
        mtbf = 1.0 / (rate_per_node_s * nodes) if rate_per_node_s > 0 else 1e9
        interval = young_interval(checkpoint_cost_s=params.checkpoint_cost_s, mtbf_s=mtbf)
    if periodic and params.checkpoint_interval_s <= 0:
        interval = young_interval(checkpoint_cost_s=params.checkpoint_cost_s, mtbf_s=params.mtbf_prior_s)
    return interval


def _worked_and_billed(trace: Trace, params: SimParams) -> tuple[list[TraceEvent], list[TraceEvent]]:
    """The events as the job sees them (a join works `node_ready_s` and `replacement_delay_s` after
    the trace adds it) and as they are billed (from the later grant when capacity comes slower)."""
    events, billed = list(trace.events), list(trace.events)
    join_delay = params.replacement_delay_s + params.node_ready_s
    if join_delay:
        events = _joins_delayed(events, join_delay)
        events.sort(key=lambda e: (e.t_s, e.kind == ADD))
    if params.replacement_delay_s:
        billed = _joins_delayed(billed, params.replacement_delay_s)
    return events, billed


def _joins_delayed(events: list[TraceEvent], delay_s: float) -> list[TraceEvent]:
    """`events` with every join after the start `delay_s` later."""
    return [type(e)(e.t_s + (delay_s if e.kind == ADD and e.t_s > 0 else 0.0), e.kind, e.node) for e in events]


def _first_crossing(series: list[tuple[float, float]], target: float) -> float | None:
    for (t0, s0), (t1, s1) in itertools.pairwise(series):
        if s0 < target <= s1:
            return t0 + (target - s0) * (t1 - t0) / (s1 - s0) if s1 > s0 else t1
    return None


def result_dict(result: SimResult) -> dict:
    """Everything, JSON-ready."""
    d = asdict(result)
    d.update(result.summary())
    return d
