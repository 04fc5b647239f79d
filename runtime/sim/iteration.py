"""Iteration time per (strategy, failure state), from the runtime's own layouts and schedules.

Every figure here is a replay of `runtime.schedule.build_schedule` lists for a layout made by the
runtime's strategy (`runtime.strategies.<name>.layout_for`) with profiled durations
(`runtime.planner.throughput.CostModel`). Results are cached per canonical state, so a simulation of
thousands of events replays each distinct state once.

Identical pipelines only meet in the all-reduce, so a state is replayed on a stand-in job of one
pipeline (or a few, for recycle) with the all-reduce groups scaled up to the real data-parallel
degree. Recycle couples pipelines (a lost node's micro-batches run on peers), so a recycle state is
replayed exactly, with the runtime's recycle layout over all pipelines, up to RECYCLE_EXACT_DP
pipelines. Above that it is priced through the marginal cost of re-routed work measured on a
RECYCLE_EXACT_DP-pipeline stand-in with one hole at the most-hit stage: the extra micro-batches each
surviving peer takes there, holes * M / (pipelines - holes), are charged at that marginal cost
(stages absorb their re-routed work in parallel, so the most-hit stage sets the step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.config import JobConfig, ModelSpec
from runtime.layout import split_microbatches
from runtime.planner.throughput import CostModel
from runtime.strategies import get_strategy
from runtime.strategies.oobleck import pipeline_templates

RECYCLE_EXACT_DP = 4


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
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def total_microbatches(self) -> int:
        return self.dp * self.microbatches

    def _config(self, *, dp: int, pp: int, microbatches: int, strategy: str, schedule: str) -> JobConfig:
        return JobConfig(
            model=self.spec,
            dp=dp,
            pp=pp,
            microbatches=microbatches,
            global_batch=dp * microbatches,
            strategy=strategy,
            schedule=schedule,
            layer_costs=self.cost.layer_costs(),
            min_stages=min(self.min_stages, pp),
        )

    def _replay(self, key: tuple, make) -> float:  # type: ignore[no-untyped-def]
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # -- per strategy ---------------------------------------------------------------------------
    def full_pipelines(self, pipelines: int, *, schedule: str = "1f1b") -> float:
        """`pipelines` full pipelines sharing the global batch (checkpoint-restart, failure-free)."""
        if pipelines < 1:
            return float("inf")
        per_pipe = -(-self.total_microbatches // pipelines)
        return self.cost.pipeline_step_time(
            self.spec, pp=self.pp, microbatches=per_pipe, dp=pipelines, schedule=schedule
        )

    def oobleck(self, nodes: int) -> float:
        """Pipelines re-instantiated from the runtime's templates over `nodes` nodes."""
        config = self._config(
            dp=self.dp, pp=self.pp, microbatches=self.microbatches, strategy="oobleck", schedule="1f1b"
        )
        templates = self._replay(("templates",), lambda: pipeline_templates(config))
        nodes = min(nodes, self.dp * self.pp)
        if nodes not in templates:
            return float("inf")
        sizes = templates[nodes]
        shares = split_microbatches(self.total_microbatches, sizes)
        worst = 0.0
        for size, share in sorted(set(zip(sizes, shares, strict=True))):
            worst = max(
                worst,
                self.cost.pipeline_step_time(self.spec, pp=size, microbatches=share, dp=len(sizes), schedule="1f1b"),
            )
        return worst

    def bamboo(self, alive: tuple[bool, ...], *, pipelines: int) -> float:
        """A pipeline whose lost stages are run by their ring predecessors (worst pipeline of the job)."""
        key = ("bamboo", alive, pipelines)

        def make() -> float:
            per_pipe = -(-self.total_microbatches // pipelines)
            config = self._config(dp=1, pp=self.pp, microbatches=per_pipe, strategy="bamboo", schedule="1f1b")
            slots = [[s if ok else None for s, ok in enumerate(alive)]]
            layout = get_strategy("bamboo").layout_for(config, slots)
            return self.cost.step_time(layout, schedule="1f1b", allreduce_scale=pipelines)

        return self._replay(key, make)

    def recycle(self, holes: tuple[int, ...], *, pipelines: int) -> float:
        """`holes[s]` lost stage-s nodes among `pipelines` pipelines, re-routed to same-stage peers."""
        if any(h >= pipelines for h in holes):
            return float("inf")
        key = ("recycle", holes, pipelines)

        def exact(dp: int, holes: tuple[int, ...], scale: int) -> float:
            per_pipe = -(-self.total_microbatches // pipelines)
            config = self._config(dp=dp, pp=self.pp, microbatches=per_pipe, strategy="recycle", schedule="fiw")
            slots: list[list[int | None]] = [[p * self.pp + s for s in range(self.pp)] for p in range(dp)]
            for s, h in enumerate(holes):
                for j in range(h):  # spread holes over pipelines, stage by stage
                    slots[(s + j) % dp][s] = None
            layout = get_strategy("recycle").layout_for(config, slots)
            return self.cost.step_time(layout, schedule="fiw", allreduce_scale=scale)

        def make() -> float:
            if pipelines <= RECYCLE_EXACT_DP:
                return exact(pipelines, holes, 1)
            reduced = RECYCLE_EXACT_DP
            scale = max(1, round(pipelines / reduced))
            base = self._replay(("recycle-base", pipelines), lambda: exact(reduced, (0,) * self.pp, scale))
            if not any(holes):
                return base
            worst_stage = max(range(self.pp), key=lambda s: holes[s])
            one = [0] * self.pp
            one[worst_stage] = 1
            with_hole = self._replay(("recycle-one", pipelines, worst_stage), lambda: exact(reduced, tuple(one), scale))
            per_mb = self.microbatches_per(pipelines)
            per_extra = (with_hole - base) / (per_mb / (reduced - 1))
            extra = holes[worst_stage] * per_mb / (pipelines - holes[worst_stage])
            return base + per_extra * extra

        return self._replay(key, make)

    def microbatches_per(self, pipelines: int) -> int:
        return -(-self.total_microbatches // pipelines)
