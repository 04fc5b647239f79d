"""Throughput model: the iteration time of a layout, from the runtime's own schedule.

The layout comes from the runtime (`runtime.parallel.layout` / `runtime.strategies`), the per-node action lists
from `runtime.parallel.schedule.build_schedule` (as tuples: `schedule_rows`), and their replay from
`runtime.parallel.schedule.simulate` (its twin without objects: `replay_end`; without rows: `step_end`); this
module only supplies per-action durations:

* F, I, W, B, RF: the profiled per-layer times summed over the stage's layers (`stage_durations`),
  times `compute_scale` (CPU contention, or a device-speed ratio);
* RECV_F / RECV_B: latency + boundary activation bytes / network bandwidth (sends are non-blocking);
* OPT: ring all-reduce of the run's gradients among its owners, 2 (n-1)/n * bytes / bandwidth +
  2 (n-1) latency, plus the AdamW update (parameters and two moments read and written once).

A 1F1B or F-I-W step is periodic in the number of micro-batches once the pipeline is full, so for
many micro-batches the replay runs at pp and 2 pp micro-batches and extrapolates linearly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.config import JobConfig, ModelSpec
from runtime.parallel.layout import Layout, pipelines_layout
from runtime.parallel.schedule import (
    ALL_REDUCE,
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    OPTIMIZER,
    RECV_ACT,
    RECV_GRAD,
    REDUNDANT_FORWARD,
    SEND_ACT,
    SEND_GRAD,
    Action,
    Prices,
    Row,
    stage_durations,
    step_end,
)

OPTIMIZER_BYTES_PER_PARAM_BYTE = 6.0
"""AdamW reads and writes parameter, gradient and two moments: about 6 passes over the parameter bytes."""


@dataclass(frozen=True, slots=True)
class Network:
    """Point-to-point bandwidth and latency between two nodes."""

    bandwidth_gbps: float = 10.0
    latency_s: float = 50e-6

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8.0


def allreduce_time(nbytes: float, members: int, network: Network) -> float:
    """Ring all-reduce of `nbytes` among `members` nodes."""
    if members <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (members - 1) / members * nbytes / network.bytes_per_s + 2 * (members - 1) * network.latency_s


@dataclass(slots=True)
class CostModel:
    """Per-action durations for one model profile on one instance type."""

    fiw: list[tuple[float, float, float]]
    """(forward, backward-input, backward-weight) seconds per layer for one micro-batch."""
    output_bytes: list[float]
    """Bytes each layer outputs for one micro-batch (what a stage boundary sends)."""
    param_bytes: list[float]
    network: Network = field(default_factory=Network)
    memory_bandwidth_gbs: float = 20.0
    compute_scale: float = 1.0
    """Multiplies every compute duration (e.g. processes per core on an oversubscribed CPU)."""
    step_overhead_s: float = 0.0
    """Fixed per-step cost outside the action lists (e.g. Python bookkeeping of the executor)."""
    parameters: list[float] | None = None
    """What each layer holds, for the partition only (a layer without parameters joins a neighbour's
    stage, as in the runtime); None: every layer holds some (`param_bytes` may still be 0 to leave
    the all-reduce out of a model)."""
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_profile(cls, profile, *, network: Network | None = None, **kwargs) -> CostModel:  # type: ignore[no-untyped-def]
        """Build from a `runtime.planner.profile.ModelProfile`."""
        return cls(
            fiw=profile.fiw(),
            output_bytes=[lay.output_bytes for lay in profile.layers],
            param_bytes=[lay.param_bytes for lay in profile.layers],
            parameters=[lay.param_bytes for lay in profile.layers],
            network=network or Network(),
            memory_bandwidth_gbs=kwargs.pop("memory_bandwidth_gbs", profile.device.memory_bandwidth_gbs),
            **kwargs,
        )

    # -- durations ------------------------------------------------------------------------------
    def bounds(self, pp: int) -> list[tuple[int, int]]:
        """Balanced stage boundaries for `pp` stages (cached: the partition is an O(pp n^2) DP)."""
        key = ("bounds", pp)
        if key not in self._cache:
            from runtime.parallel.partition import partition_layers

            self._cache[key] = partition_layers(self.layer_costs(), pp, parameters=self.parameters)
        return self._cache[key]

    def layer_costs(self) -> list[float]:
        """Forward + backward seconds per layer (what the partitioner balances)."""
        return [f + i + w for f, i, w in self.fiw]

    def optimizer_time(self, lo: int, hi: int, members: int) -> float:
        """OPT of layers [lo, hi): ring all-reduce of their gradients among `members` owners, then
        the AdamW update (parameters and two moments read and written once)."""
        nbytes = sum(self.param_bytes[lo:hi])
        mem_bps = self.memory_bandwidth_gbs * 1e9
        return allreduce_time(nbytes, members, self.network) + OPTIMIZER_BYTES_PER_PARAM_BYTE * nbytes / mem_bps

    def stage_compute(self, stages: tuple[tuple[int, int], ...]) -> dict[int, tuple[float, float, float]]:
        """Stage id -> (F, I, W) seconds of one micro-batch (profiled per-layer times x compute_scale)."""
        scale = self.compute_scale
        return {
            stage: tuple(sum(self.fiw[j][k] for j in range(lo, hi)) * scale for k in range(3))  # type: ignore[misc]
            for stage, (lo, hi) in enumerate(stages)
        }

    def stage_join_times(self, stages: tuple[tuple[int, int], ...], holders: dict[int, int]) -> dict[int, float]:
        """Stage id -> what a node that does not hold the stage adds to its end of step by taking it
        on (recycle's spill): one more OPT, the stage's all-reduce among its `holders` + 1 owners and
        the update (a node runs its OPTs one after another; `duration_fn` prices the same action)."""
        return {stage: self.optimizer_time(lo, hi, holders.get(stage, 0) + 1) for stage, (lo, hi) in enumerate(stages)}

    def action_prices(
        self, layout: Layout, *, allreduce_scale: int = 1
    ) -> tuple[dict[str, list[float]], Callable[[Row], float]]:
        """Durations of `layout`'s actions, computed once per layout rather than per action:
        kind -> per-stage seconds for compute and point-to-point actions (sends are non-blocking:
        0), and a function of an ALLREDUCE / OPT row (`Row` fields: layers at 5, group at 6)."""
        per_stage = stage_durations(layout, self.fiw)
        scale = self.compute_scale
        net = self.network
        fiw = [per_stage[s] for s in range(len(layout.stages))]
        recv_act = [net.latency_s + self.output_bytes[lo - 1] / net.bytes_per_s for lo, _ in layout.stages]
        recv_grad = [net.latency_s + self.output_bytes[hi - 1] / net.bytes_per_s for _, hi in layout.stages]
        forward = [f * scale for f, _, _ in fiw]
        zeros = [0.0] * len(fiw)
        by_stage = {
            FORWARD: forward,
            REDUNDANT_FORWARD: forward,
            BACKWARD_INPUT: [i * scale for _, i, _ in fiw],
            BACKWARD_WEIGHT: [w * scale for _, _, w in fiw],
            BACKWARD: [(i + w) * scale for _, i, w in fiw],
            RECV_ACT: recv_act,
            RECV_GRAD: recv_grad,
            SEND_ACT: zeros,
            SEND_GRAD: zeros,
        }
        optimizer: dict[tuple[tuple[int, int], int], float] = {}

        def by_group(row: Row) -> float:
            if row[0] != OPTIMIZER:
                return 0.0  # the all-reduce's time is priced into the OPT that waits for it
            key = (row[5], len(row[6]))
            found = optimizer.get(key)
            if found is None:
                lo, hi = row[5]
                found = optimizer[key] = self.optimizer_time(lo, hi, len(row[6]) * allreduce_scale)
            return found

        return by_stage, by_group

    def duration_fn(self, layout: Layout, *, allreduce_scale: int = 1) -> Callable[[Action], float]:
        """Duration of each action of `layout`'s schedule (`action_prices` per `Action`). `allreduce_scale`
        multiplies the all-reduce group size (a one-pipeline stand-in for `dp` identical pipelines)."""
        by_stage, by_group = self.action_prices(layout, allreduce_scale=allreduce_scale)

        def duration(act: Action) -> float:
            if act.kind in (ALL_REDUCE, OPTIMIZER):
                return by_group((act.kind, act.stage, act.microbatch, act.peer, act.pipeline, act.layers, act.group))
            prices = by_stage.get(act.kind)
            return prices[act.stage] if prices is not None else 0.0

        return duration

    # -- step time ------------------------------------------------------------------------------
    def step_time(self, layout: Layout, *, schedule: str = "1f1b", allreduce_scale: int = 1) -> float:
        """Seconds of one training step of `layout`: the end of the replay of the runtime's schedule
        (`step_end`: what `replay_end` gives for `schedule_rows`, and `simulate` for `build_schedule`'s
        lists, without building rows, `Action`s or a timeline: the simulator replays thousands of
        coupled groups)."""
        def prices() -> Prices:
            return self.action_prices(layout, allreduce_scale=allreduce_scale)

        return step_end(layout, schedule, stage_durations(layout, self.fiw), prices) + self.step_overhead_s

    def pipeline_layout(self, spec: ModelSpec, *, pp: int, microbatches: int, microbatch_size: int = 1) -> Layout:
        """One pipeline of `pp` nodes running `microbatches` micro-batches, balanced stages."""
        config = JobConfig(
            model=spec,
            dp=1,
            pp=pp,
            microbatches=microbatches,
            global_batch=microbatches * microbatch_size,
            layer_costs=self.layer_costs(),
        )
        return pipelines_layout(config, [list(range(pp))], costs=self.layer_costs())

    def pipeline_step_time(
        self, spec: ModelSpec, *, pp: int, microbatches: int, dp: int = 1, schedule: str = "1f1b"
    ) -> float:
        """Step time of `dp` identical pipelines of `pp` stages, `microbatches` each (cached).

        Pipelines only meet in the gradient all-reduce, so one pipeline is replayed with its
        all-reduce groups scaled by `dp`. Past 2 * pp micro-batches the (periodic) step time is
        extrapolated from replays at pp and 2 * pp micro-batches.
        """
        key = (pp, microbatches, dp, schedule)
        if key in self._cache:
            return self._cache[key]
        exact_limit = 2 * pp
        if microbatches <= exact_limit:
            layout = self.pipeline_layout(spec, pp=pp, microbatches=microbatches)
            value = self.step_time(layout, schedule=schedule, allreduce_scale=dp)
        else:
            m1, m2 = pp, exact_limit
            t1 = self.pipeline_step_time(spec, pp=pp, microbatches=m1, dp=dp, schedule=schedule)
            t2 = self.pipeline_step_time(spec, pp=pp, microbatches=m2, dp=dp, schedule=schedule)
            value = t2 + (microbatches - m2) * (t2 - t1) / (m2 - m1)
        self._cache[key] = value
        return value

    def analytic_step_time(self, *, pp: int, microbatches: int, dp: int = 1, schedule: str = "1f1b") -> float:
        """Closed-form estimate (no replay), for screening many candidates fast.

        1F1B: sum over stages of (F + B) for the first micro-batch's trip, plus (M - 1) times the
        slowest stage's F + B, plus boundary transfers and the slowest all-reduce + update. F-I-W:
        the same with I on the critical path and W filling bubbles, bounded below by the busiest stage.
        """
        bounds = self.bounds(pp)
        scale = self.compute_scale
        net = self.network
        stages = []
        for s, (lo, hi) in enumerate(bounds):
            f, i, w = (sum(self.fiw[j][k] for j in range(lo, hi)) * scale for k in range(3))
            # Receives sit on the stage's own timeline once per micro-batch (activation in, gradient in).
            recv = (net.latency_s + self.output_bytes[lo - 1] / net.bytes_per_s) if s else 0.0
            if s < pp - 1:
                recv += net.latency_s + self.output_bytes[hi - 1] / net.bytes_per_s
            stages.append((f, i, w, recv))
        busiest = max(f + i + w + r for f, i, w, r in stages)
        if schedule == "fiw":
            trip = sum(f + i + r for f, i, _, r in stages) + stages[0][2]
            compute = max(trip + (microbatches - 1) * busiest, microbatches * busiest)
        else:
            trip = sum(f + i + w + r for f, i, w, r in stages)
            compute = trip + (microbatches - 1) * busiest
        comm = 0.0
        mem_bps = self.memory_bandwidth_gbs * 1e9
        update = max(
            allreduce_time(sum(self.param_bytes[lo:hi]), dp, self.network)
            + OPTIMIZER_BYTES_PER_PARAM_BYTE * sum(self.param_bytes[lo:hi]) / mem_bps
            for lo, hi in bounds
        )
        return compute + comm + update + self.step_overhead_s
