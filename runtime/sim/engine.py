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
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field

from runtime.checkpointing.durability import estimated_mtbf_s
from runtime.checkpointing.youngdaly import young_interval
from runtime.config import FAULT_TOLERANT_STRATEGIES, JobConfig
from runtime.distributed.membership import joiners_worth_a_regroup
from runtime.sim.iteration import IterationModel
from runtime.sim.plans import Pattern
from runtime.sim.prices import PriceSeries
from runtime.traces import ADD, Trace

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
    step boundary (the job pauses only for the switch). Neither has a source; the runtime measured
    0.44 s (kill -> next commit) and 0.47 s (replacement ready -> first commit) on localhost."""
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
        if self.down_since is None:
            return
        self.down_s += t - self.down_since
        self.down_since = None
        self.restores += 1
        self.resume_at = t
        self.pause(params.restart_total_s)

    def finish_down(self, t: float) -> None:
        if self.down_since is not None:
            self.down_s += t - self.down_since


def _stage_lost(strategy: str, slots: list[list[str | None]], pp: int) -> bool:
    """Whether some stage has no copy left on a working node: its slot holders (and, for bamboo,
    the ring predecessors that keep a replica of it) are gone in every pipeline. The runtime then
    restores from the last checkpoint (`Strategy.falls_back_to_checkpoint`)."""
    if not slots:
        return True
    for s in range(pp):
        holders = [row[s] for row in slots]
        if strategy == "bamboo":
            holders += [row[(s - 1) % pp] for row in slots]
        if all(n is None for n in holders):
            return True
    return False


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
    params = params or SimParams()
    dp, pp = model.dp, model.pp
    wanted = dp * pp
    samples_per_step = model.total_microbatches * samples_per_microbatch
    failure_free = samples_per_step / model.full_pipelines(dp)

    # Young's interval from the trace's rate (the runtime's durability rule for every strategy).
    rate_per_node_s = trace.preemption_rate() / 3600.0
    interval = params.checkpoint_interval_s
    if interval <= 0:
        mtbf = 1.0 / (rate_per_node_s * wanted) if rate_per_node_s > 0 else 1e9
        interval = young_interval(checkpoint_cost_s=params.checkpoint_cost_s, mtbf_s=mtbf)
    periodic = strategy != "checkpoint" and params.checkpoint_every_strategy
    if periodic and params.checkpoint_interval_s <= 0:
        interval = young_interval(checkpoint_cost_s=params.checkpoint_cost_s, mtbf_s=params.mtbf_prior_s)
    duty = interval / (interval + params.checkpoint_cost_s) if periodic else 1.0
    run = _Run(samples_per_step, duty=duty, interval_s=interval if periodic else math.inf)
    needed_checkpoint = 0  # losses that took every copy of some layer (the runtime's "failures")

    def follow_the_runtimes_interval(t: float) -> None:
        """After a loss that needed the checkpoint, the interval the runtime's next plan carries."""
        nonlocal needed_checkpoint
        needed_checkpoint += 1
        if not periodic or params.checkpoint_interval_s > 0:
            return
        mtbf = estimated_mtbf_s(params.mtbf_prior_s, t, needed_checkpoint)
        run.interval_s = young_interval(checkpoint_cost_s=params.checkpoint_cost_s, mtbf_s=mtbf)
        run.duty = run.interval_s / (run.interval_s + params.checkpoint_cost_s)
    run.target = samples_target

    join_delay = params.replacement_delay_s + params.node_ready_s
    events = list(trace.events)
    billed = list(trace.events)
    if join_delay:
        events = [
            type(e)(e.t_s + (join_delay if e.kind == ADD and e.t_s > 0 else 0.0), e.kind, e.node) for e in events
        ]
        events.sort(key=lambda e: (e.t_s, e.kind == ADD))
    if params.replacement_delay_s:  # capacity acquisition is slower: billed from the later grant
        billed = [
            type(e)(e.t_s + (params.replacement_delay_s if e.kind == ADD and e.t_s > 0 else 0.0), e.kind, e.node)
            for e in billed
        ]
    live: list[str] = []
    live_set: set[str] = set()
    ready_at: dict[str, float] = {}  # when each live node joined (its wait for a batch starts there)
    cancelled: set[str] = set()

    # Strategy state: slots[p][s] = node name or None; spares hold the rest.
    slots: list[list[str | None]] = []
    where: dict[str, tuple[int, int]] = {}

    committed = 0.0
    segment_start = 0.0
    pause_from = 0.0  # checkpoint-restart: when the current segment's pause (save, restart) began
    save_s = 0.0  # ... and how much of that pause writes a checkpoint (the rest restarts)

    members: set[str] = set()
    """checkpoint-restart: the generation's members, its pipelines' nodes and the standing-by nodes
    that fill the rest of the dp x pp slots (`CheckpointStrategy`: standby members of the layout,
    in the group's commit); live nodes beyond are spares outside the group."""

    def form(pipelines_wanted: int | None = None) -> None:
        """Re-form full pipelines from all live nodes (a restart or a reconfiguration)."""
        nonlocal slots, members
        count = min(dp, len(live) // pp) if pipelines_wanted is None else pipelines_wanted
        slots = [[live[p * pp + s] for s in range(pp)] for p in range(count)]
        where.clear()
        for p, row in enumerate(slots):
            for s, node in enumerate(row):
                where[node] = (p, s)
        members = set(live[:wanted])

    def working() -> int:
        return sum(1 for row in slots for n in row if n is not None)

    def pattern() -> Pattern:
        return tuple(tuple(n is not None for n in row) for row in slots)

    def step_time() -> float:
        if strategy == "checkpoint":
            return model.full_pipelines(len(slots))
        if strategy == "oobleck":
            return model.oobleck(working()) if working() else math.inf
        if not slots:
            return math.inf
        return model.step(strategy, pattern())

    def held_joiners() -> tuple[list[str], int]:
        """checkpoint/oobleck: the live nodes waiting outside the generation, and the slots filled."""
        placed = members if strategy == "checkpoint" else where
        return [n for n in live if n not in placed], len(placed)

    def joiners_due(t: float) -> bool:
        """The runtime's rule: are the waiting joiners worth a regroup at t?"""
        waiting, filled = held_joiners()
        return joiners_worth_a_regroup(
            strategy, pp=pp, filled=filled, empty=wanted - filled, waiting=len(waiting),
            waited_s=t - min((ready_at[n] for n in waiting), default=t),
            wait_bound_s=params.join_batch_wait_s, urgent=not slots)

    def batch_deadline() -> float | None:
        """When the oldest joiner held for a batch will have waited `join_batch_wait_s` (None: none held)."""
        if strategy not in ("checkpoint", "oobleck") or not slots or run.down_since is not None:
            return None
        waiting, filled = held_joiners()
        if not waiting or filled >= wanted:
            return None
        return min(ready_at[n] for n in waiting) + params.join_batch_wait_s

    def take_held_joiners(t: float) -> None:
        """The bound passed: the job regroups for the joiners it held (a restart or a re-instantiation)."""
        nonlocal slots
        run.joiner_regroups += 1
        if strategy == "checkpoint":
            checkpoint_restart(t, save_first=True)
            return
        run.advance(t)
        slots = _oobleck_assign(live, wanted, where)
        run.step_s = step_time()
        if t >= run.resume_at:
            run.react(params, params.reconfigure_s, loss=False)

    def checkpoint_progress(t: float) -> tuple[float, float]:
        """(committed, produced-but-uncommitted) samples of the current segment at time t."""
        if not slots:
            return committed, 0.0
        rate = samples_per_step / model.full_pipelines(len(slots))
        s = max(0.0, t - segment_start)
        cycle = interval + params.checkpoint_cost_s
        k = math.floor(s / cycle)
        phase = s - k * cycle
        return committed + k * interval * rate, min(phase, interval) * rate

    def account_segment(t: float, *, losing: bool) -> None:
        """checkpoint-restart: the wall time of the current segment up to t, in its buckets (the
        pause: its checkpoint save, then detection and restart; then cycles of compute and writes;
        `losing`: the compute since the last complete write is redone)."""
        if segment_start == math.inf or t <= pause_from:
            return
        paused = min(t, segment_start) - pause_from
        run.spent["checkpointing"] += min(paused, save_s)
        run.spent["restarting"] += paused - min(paused, save_s)
        if t <= segment_start:
            return
        cycle = interval + params.checkpoint_cost_s
        s = t - segment_start
        k = math.floor(s / cycle)
        phase = s - k * cycle
        run.spent["training"] += k * interval + min(phase, interval)
        run.spent["checkpointing"] += k * params.checkpoint_cost_s + max(0.0, phase - interval)
        if losing:
            run.redo(min(phase, interval))

    def checkpoint_restart(t: float, *, save_first: bool) -> None:
        nonlocal committed, segment_start, pause_from, save_s
        had_slots = bool(slots)
        done, pending = checkpoint_progress(t)
        account_segment(t, losing=not (save_first and had_slots))
        if save_first and had_slots:
            committed = done + pending
            extra = params.checkpoint_cost_s
        else:
            committed = done
            run.lost += pending
            extra = params.detection_s if had_slots and params.notice_s <= 0 else 0.0
        run.series.append((t, done + pending))
        run.series.append((t, committed))
        form()
        if not slots:  # nothing can run: wait for replacements (the next join restarts)
            if run.down_since is None:
                run.down_since = t
            segment_start = math.inf
            return
        if run.down_since is not None:
            run.down_s += t - run.down_since
            run.down_since = None
            run.restores += 1
        segment_start = t + extra + params.restart_total_s
        pause_from, save_s = t, (extra if save_first and had_slots else 0.0)
        run.pauses += extra + params.restart_total_s
        run.series.append((segment_start, committed))
        run.samples = committed

    def lose_state(t: float, *, hit: bool) -> bool:
        """Stop when no usable plan is left; True when the job is (or stays) down."""
        if run.down_since is not None:
            return True
        if hit:
            run.lose_in_flight(params)
        follow_the_runtimes_interval(t)
        run.stop(t)
        return True

    def reform() -> None:
        """Lay the job out afresh on every live node (after a restore, or when down)."""
        nonlocal slots
        if strategy == "oobleck":
            slots = _oobleck_assign(live, wanted, where)
        else:
            form()

    def oobleck_layer_lost(gone: list[str]) -> bool:
        """Whether `gone` took every holder of some layer in oobleck's current plan (its pipelines
        hold every layer once each; a spare holds none)."""
        row = slots[0] if slots else []
        held = model.oobleck_layers(len(row))
        everything = frozenset().union(*held)
        kept = frozenset().union(*(layers for node, layers in zip(row, held, strict=True) if node not in gone))
        return kept != everything

    def restore_from_checkpoint(t: float) -> None:
        """A loss took every copy of some layer: stop, re-form on who is left, resume from the
        checkpoint when a plan exists again (else wait for replacements)."""
        lose_state(t, hit=True)
        reform()
        run.step_s = step_time()
        if run.step_s < math.inf:
            run.resume(t, params)
            run.react(params, 0.0, loss=True)  # the loss is detected first, as for any other reaction

    index = 0
    while index < len(events):
        t = events[index].t_s
        while (due := batch_deadline()) is not None and due <= t and joiners_due(due):
            take_held_joiners(due)
        batch = []
        while index < len(events) and events[index].t_s == t:
            batch.append(events[index])
            index += 1
        if strategy != "checkpoint":
            run.advance(t)
        removed = [e.node for e in batch if e.kind != ADD and e.node in live_set]
        # A node reclaimed before it was ready (its join delayed past the removal) never works.
        cancelled.update(e.node for e in batch if e.kind != ADD and e.node not in live_set)
        added = [e.node for e in batch if e.kind == ADD and e.node not in live_set and e.node not in cancelled]
        for node in removed:
            live_set.discard(node)
            live.remove(node)
        for node in added:
            live_set.add(node)
            live.append(node)
            ready_at[node] = t
        hit = [n for n in removed if n in where]

        if t == 0:
            if strategy == "oobleck":
                slots = _oobleck_assign(live, wanted, where)
            else:
                form()
            run.step_s = step_time()
            if run.step_s == math.inf:
                run.down_since = 0.0
                segment_start = math.inf
            continue

        if strategy == "checkpoint":
            # A batch of joiners worth a regroup while a slot of the dp x pp grid is empty
            # (`joiners_worth_a_regroup`) ends the runtime's generation at the next step boundary, and
            # this strategy restarts every generation from a checkpoint, written first at that boundary.
            room = bool(added) and len(members) < wanted
            # A standing-by member's loss fails the generation's commit like a working node's.
            lost_member = [n for n in removed if n in members]
            if room and not lost_member and slots and t < segment_start:
                form()  # joiners during a restart join it (module notes): same pause, more pipelines
            elif lost_member or (room and joiners_due(t)):
                run.joiner_regroups += not lost_member
                checkpoint_restart(t, save_first=not lost_member or params.notice_s >= params.checkpoint_cost_s)
            continue

        if run.down_since is not None:
            # Down: re-form from every live node as soon as some plan is possible again.
            reform()
            run.step_s = step_time()
            if run.step_s < math.inf:
                run.resume(t, params)
            continue

        if strategy == "oobleck":
            # A batch of joiners worth a regroup while fewer than dp x pp nodes work
            # (`joiners_worth_a_regroup`) ends the runtime's generation, and oobleck re-instantiates
            # its pipelines over every live node (one pause for the batch, not one each).
            if hit and oobleck_layer_lost(hit):
                restore_from_checkpoint(t)
                continue
            room = bool(added) and working() < wanted
            if hit or (room and (t < run.resume_at or joiners_due(t))):
                run.joiner_regroups += not hit and t >= run.resume_at
                if hit:
                    run.lose_in_flight(params)
                slots = _oobleck_assign(live, wanted, where)
                run.step_s = step_time()
                if run.step_s == math.inf:
                    lose_state(t, hit=False)
                    continue
                if hit or t >= run.resume_at:  # joiners during a re-instantiation join it (module notes)
                    run.react(params, params.reconfigure_s, loss=bool(hit))
            continue

        if strategy == "bamboo":
            reconfigure = False
            for node in hit:
                p, s = where.pop(node)
                slots[p][s] = None
                pred = slots[p][(s - 1) % pp]
                succ = slots[p][(s + 1) % pp]
                if pred is None or succ is None or all(n is None for n in slots[p]):
                    reconfigure = True  # consecutive losses: no replica left for one of the stages
            if hit and _stage_lost(strategy, slots, pp):
                restore_from_checkpoint(t)
                continue
            if hit:
                run.lose_in_flight(params)
            # Standing-by nodes and joiners fill the holes of taken-over stages (the runtime's plan
            # fills empty slots, spares first: `runtime.distributed.membership.make_plan`), copying the stage and
            # its replica in the background like a recycle joiner; a new full pipeline re-forms.
            filled = 0
            if not reconfigure:
                holes = [(p, s) for p, row in enumerate(slots) for s, n in enumerate(row) if n is None]
                spare_nodes = [n for n in live if n not in where]
                for (p, s), node in zip(holes, spare_nodes, strict=False):
                    slots[p][s] = node
                    where[node] = (p, s)
                    filled += 1
                reconfigure = len(slots) < dp and len(spare_nodes) - filled >= pp
            if reconfigure:
                form()
                run.react(params, params.reconfigure_s, loss=bool(hit))
            elif hit:
                run.react(params, params.bamboo_failover_s + (params.join_s if filled else 0.0), loss=True)
            elif filled:
                run.pause(params.join_s)
            run.step_s = step_time()
            if run.step_s == math.inf:
                lose_state(t, hit=False)
            continue

        # recycle
        for node in hit:
            p, s = where.pop(node)
            slots[p][s] = None
        if hit and _stage_lost(strategy, slots, pp):
            restore_from_checkpoint(t)
            continue
        if hit:
            run.lose_in_flight(params)
        holes = [(p, s) for p, row in enumerate(slots) for s, n in enumerate(row) if n is None]
        spare_nodes = [n for n in live if n not in where]
        filled = 0
        for (p, s), node in zip(holes, spare_nodes, strict=False):
            slots[p][s] = node
            where[node] = (p, s)
            filled += 1
        if len(slots) < dp and len(spare_nodes) - filled >= pp:
            form()
            run.react(params, params.reconfigure_s, loss=bool(hit))
        elif hit:
            run.react(params, params.recycle_failover_s + (params.join_s if filled else 0.0), loss=True)
        elif filled:
            run.pause(params.join_s)
        run.step_s = step_time()
        if run.step_s == math.inf:
            lose_state(t, hit=False)

    end = trace.duration_s
    while (due := batch_deadline()) is not None and due < end and joiners_due(due):
        take_held_joiners(due)
    if strategy == "checkpoint":
        done, pending = checkpoint_progress(end)
        run.samples = done + pending
        account_segment(end, losing=False)
        # rebuild the cumulative series from restarts: linear within each segment
        run.series.append((end, run.samples))
        if samples_target is not None and run.samples >= samples_target:
            run.finish = _first_crossing(run.series, samples_target)
    else:
        run.advance(end)
    run.finish_down(end)
    if strategy == "checkpoint":
        run.spent["waiting"] += run.down_s
    else:
        run.account(end)
    node_series = [(t, n) for t, n in Trace(name="billed", events=billed, duration_s=end).node_count_series()]
    dollars = params.spot_price.cost_of_nodes(node_series, end)
    on_demand_per_sample = wanted * params.on_demand_usd_per_hour / 3600.0 / failure_free
    return SimResult(
        strategy=strategy,
        duration_s=end,
        total_samples=run.samples,
        dollars=dollars,
        failure_free_samples_per_s=failure_free,
        on_demand_dollars_per_sample=on_demand_per_sample,
        series=run.series,
        events=len(events),
        pauses_s=run.pauses,
        lost_samples=run.lost,
        samples_target=samples_target,
        finish_s=run.finish,
        checkpoint_interval_s=interval,
        restores=run.restores,
        joiner_regroups=run.joiner_regroups,
        down_s=run.down_s,
        breakdown=dict(run.spent),
    )


def _first_crossing(series: list[tuple[float, float]], target: float) -> float | None:
    for (t0, s0), (t1, s1) in itertools.pairwise(series):
        if s0 < target <= s1:
            return t0 + (target - s0) * (t1 - t0) / (s1 - s0) if s1 > s0 else t1
    return None


def _oobleck_assign(live: list[str], wanted: int, where: dict) -> list[list[str | None]]:
    """Oobleck keeps no fixed grid: the first `wanted` live nodes work, as one flat row."""
    where.clear()
    row: list[str | None] = list(live[:wanted])
    for i, node in enumerate(row):
        where[node] = (0, i)
    return [row]


def result_dict(result: SimResult) -> dict:
    """Everything, JSON-ready."""
    d = asdict(result)
    d.update(result.summary())
    return d
