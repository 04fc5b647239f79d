"""Step time per (strategy, failure state): the runtime's own plan at the job's real size.

`IterationModel` is the simulator's view of one job (model, dp x pp, micro-batches per pipeline,
cost model). Every step time it gives is `runtime.sim.plans.PlanSteps.step`: the runtime's strategy
plans the whole fleet (`layout_for` on the dp x pp slot grid, no stand-in at any size) and the plan
is replayed with profiled durations, cached per canonical state and per group of pipelines. The
named helpers below build the slot patterns the benchmark and tests ask about most.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.config import LayoutError, ModelSpec
from runtime.parallel.throughput import CostModel
from runtime.sim.plans import Pattern, PlanSteps


@dataclass(slots=True)
class IterationModel:
    """Cached step times of one job (model, dp x pp, micro-batches per pipeline) under each strategy."""

    spec: ModelSpec
    dp: int
    pp: int
    microbatches: int
    """Micro-batches per pipeline in the full layout (the global batch is dp * microbatches of them)."""
    cost: CostModel
    min_stages: int = 1
    recycle_spill: bool | None = None
    """Recycle's placement (`PlanSteps.recycle_spill`; None: the runtime's default, spill)."""
    plans: PlanSteps = field(init=False, repr=False)
    held: dict = field(init=False, repr=False, default_factory=dict)
    """Node count -> layers each position holds in oobleck's plan (`oobleck_layers`)."""

    def __post_init__(self) -> None:
        self.plans = PlanSteps(
            spec=self.spec,
            pp=self.pp,
            total_microbatches=self.total_microbatches,
            cost=self.cost,
            min_stages=self.min_stages,
            recycle_spill=self.recycle_spill,
        )

    @property
    def total_microbatches(self) -> int:
        return self.dp * self.microbatches

    def step(self, strategy: str, pattern: Pattern) -> float:
        """Seconds per step of `strategy`'s plan for the live slots `pattern` (inf: no plan)."""
        return self.plans.step(strategy, pattern)

    def full(self, pipelines: int) -> Pattern:
        """`pipelines` full rows."""
        return ((True,) * self.pp,) * pipelines

    # -- named states ---------------------------------------------------------------------------
    def full_pipelines(self, pipelines: int, *, strategy: str = "checkpoint") -> float:
        """`pipelines` full pipelines sharing the global batch (checkpoint-restart, failure-free)."""
        if pipelines < 1:
            return float("inf")
        return self.step(strategy, self.full(pipelines))

    def oobleck(self, nodes: int) -> float:
        """Pipelines re-instantiated from the runtime's templates over `nodes` nodes."""
        return self.step("oobleck", self._oobleck_pattern(nodes))

    def _oobleck_pattern(self, nodes: int) -> Pattern:
        nodes = min(nodes, self.dp * self.pp)
        flat = [s < nodes for s in range(self.dp * self.pp)]
        return tuple(tuple(flat[p * self.pp : (p + 1) * self.pp]) for p in range(self.dp))

    def oobleck_layers(self, nodes: int) -> tuple[frozenset[int], ...]:
        """The layers each of `nodes` working nodes (in slot order) holds in the runtime's oobleck
        plan for that count (empty: no plan). A loss that takes every holder of a layer loses it."""
        found = self.held.get(nodes)
        if found is None:
            try:
                by_node = self.plans.layout("oobleck", self._oobleck_pattern(nodes)).layers_by_node()
            except LayoutError:
                by_node = {}
            # slots_of numbers the live slots p * pp + s: the first `nodes` flat positions are 0..nodes-1
            found = self.held[nodes] = tuple(frozenset(by_node.get(i, ())) for i in range(nodes))
        return found

    def bamboo(self, alive: tuple[bool, ...], *, pipelines: int) -> float:
        """One pipeline with the live stages `alive` (lost ones taken over by ring predecessors),
        the others full."""
        return self.step("bamboo", (tuple(alive), *self.full(pipelines - 1)))

    def recycle(self, holes: tuple[int, ...], *, pipelines: int) -> float:
        """`holes[s]` lost stage-s nodes among `pipelines` pipelines (spread over pipelines, stage
        by stage), re-routed by the runtime's recycle plan."""
        if any(h >= pipelines for h in holes):
            return float("inf")
        rows = [[True] * self.pp for _ in range(pipelines)]
        for s, h in enumerate(holes):
            for j in range(h):
                rows[(s + j) % pipelines][s] = False
        return self.step("recycle", tuple(tuple(r) for r in rows))

    def microbatches_per(self, pipelines: int) -> int:
        return -(-self.total_microbatches // pipelines)
