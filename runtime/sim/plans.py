"""Step lengths of the runtime's own plans, at any fleet size, cached by state.

For a failure state (which slots of the dp x pp grid still hold a node) the simulator asks the
runtime's planner for the layout every survivor would run
(`runtime.strategies.get_strategy(name).layout_for(config, slots)`, the whole fleet, no stand-in)
and prices one step of it with the profiled cost model (`CostModel.step_time`, a replay of the
runtime's schedule with communication).

Two caches make a trace of thousands of events cheap:

* **state -> step.** Pipelines are interchangeable, so a state is canonicalised before planning:
  rows (pipelines) sorted by their pattern of live slots (not for recycle, see `canonical`),
  nodes renumbered by slot. Checkpoint and
  oobleck plan from the number of live nodes only (`alive_nodes` in slot order), so their key is
  that count; bamboo runs each pipeline on its own row, so (no row empty) its key is the set of
  distinct rows. The plan is the runtime's plan for the canonical relabelling of the state.
* **group -> step.** A layout splits into groups of pipelines that share no node
  (`runtime.parallel.schedule.independent_parts`, relabelled canonically so equal shapes compare equal);
  each distinct group is replayed once, and the step is the longest group's. Groups meet only in
  the gradient all-reduce, whose member count is scaled from the group's pipelines to the fleet's
  (`allreduce_scale`): exact when each node owns one layer run (checkpoint, oobleck, recycle
  before a loss), a close lower bound when a node owns a second stage's layers (a bamboo replica,
  a recycle spill host): its second all-reduce may wait for a slower group (bamboo on 4 x 4: within
  0.06% of the whole layout's replay, `tests/sim/test_any_fleet.py`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.parallel.layout import Layout
from runtime.parallel.schedule import ScheduleError, independent_parts
from runtime.parallel.throughput import CostModel
from runtime.strategies import get_strategy
from runtime.strategies.links import stated_by_cost_models

Pattern = tuple[tuple[bool, ...], ...]
"""Per pipeline row of the slot grid, which stages still hold a node."""


def schedule_of(strategy: str) -> str:
    """The schedule `strategy` runs in the simulator (`Strategy.simulated_schedule`)."""
    return get_strategy(strategy).simulated_schedule


def _separable(strategy: str, pattern: Pattern) -> bool:
    return get_strategy(strategy).plans_per_row and all(map(any, pattern))


def canonical(strategy: str, pattern: Pattern) -> tuple:
    """The cache key of a state (the strategy's own traits, `runtime.strategies.base.Strategy`): the
    live-node count when it plans from the count, the set of distinct rows when it plans per row,
    the rows sorted when its rows are interchangeable, else the state itself (recycle: spill breaks
    ties by pipeline, so reordering rows can move a hop, 0.02% of a step in the cache test)."""
    traits = get_strategy(strategy)
    if traits.plans_from_count:
        return (len(pattern), len(pattern[0]) if pattern else 0, sum(map(sum, pattern)))
    if _separable(strategy, pattern):
        return (len(pattern), tuple(sorted(set(pattern))))
    if traits.rows_interchangeable:
        return tuple(sorted(pattern))
    return pattern


def representative(strategy: str, pattern: Pattern) -> Pattern:
    """The state planned for `pattern`'s key: the rows sorted; for a row-separable strategy each
    distinct row once and the first repeated to the same number of rows (same groups, same step)."""
    rows = sorted(pattern) if get_strategy(strategy).rows_interchangeable else list(pattern)
    if _separable(strategy, pattern):
        distinct = sorted(set(pattern))
        rows = distinct + [distinct[0]] * (len(pattern) - len(distinct))
    return tuple(rows)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block (then back as it was). Planning and replaying a
    state of a thousand-node fleet allocate a few hundred thousand short-lived tuples and lists, no
    cycles among them (reference counting frees them); each allocation burst made the collector walk
    the simulator's whole heap (the plan and group caches), 60% of the 1,000-node recycle run's CPU."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def slots_of(pattern: Pattern) -> list[list[int | None]]:
    """The slot grid of a pattern, node p * pp + s at a live slot (p, s)."""
    return [[p * len(row) + s if ok else None for s, ok in enumerate(row)] for p, row in enumerate(pattern)]


@dataclass(slots=True)
class PlanSteps:
    """Cached step seconds of the runtime's plan for (strategy, failure state) of one job."""

    spec: ModelSpec
    pp: int
    total_microbatches: int
    """Micro-batches per step of the whole job (the global batch; constant under every strategy)."""
    cost: CostModel
    min_stages: int = 1
    recycle_spill: bool | None = None
    """`JobConfig.recycle_spill` for recycle's plans (None: the runtime's default, spill on;
    False: ReCycle as published, a lost hop goes to same-stage peers only)."""
    states: dict = field(default_factory=dict, repr=False)
    groups: dict = field(default_factory=dict, repr=False)
    planned: int = 0
    """States planned (cache misses), for the benchmark's account of where time goes."""

    def config(self, strategy: str, pipelines: int) -> JobConfig:
        """The job as the runtime sees it with `pipelines` rows of slots (the global batch shared)."""
        per_pipe = -(-self.total_microbatches // pipelines)
        return JobConfig(
            model=self.spec,
            dp=pipelines,
            pp=self.pp,
            microbatches=per_pipe,
            global_batch=pipelines * per_pipe,
            strategy=strategy,
            schedule=schedule_of(strategy),
            # What a worker of this job states: its layers' device time (seconds per micro-batch) and
            # the links' bandwidth, from which recycle prices a spill host's traffic as it would.
            **stated_by_cost_models([self.cost]),
            min_stages=min(self.min_stages, self.pp),
            **({} if self.recycle_spill is None else {"recycle_spill": self.recycle_spill}),
        )

    def step(self, strategy: str, pattern: Pattern) -> float:
        """Seconds of one step of the runtime's plan for `pattern` (inf: no usable plan)."""
        if not pattern or not any(map(any, pattern)):
            return float("inf")
        if _separable(strategy, pattern) and len(set(pattern)) > 1:
            # Its groups are its distinct rows: each row's group priced once per fleet size, from
            # the plan of a fleet of that row (the same group, the same all-reduce scale).
            return max(self._cached(strategy, (row,) * len(pattern)) for row in set(pattern))
        return self._cached(strategy, pattern)

    def _cached(self, strategy: str, pattern: Pattern) -> float:
        key = (strategy, canonical(strategy, pattern))
        found = self.states.get(key)
        if found is None:
            found = self.states[key] = self._plan(strategy, representative(strategy, pattern))
        return found

    def layout(self, strategy: str, pattern: Pattern) -> Layout:
        """The runtime's layout for `pattern` (raises LayoutError when it has none)."""
        return get_strategy(strategy).layout_for(self.config(strategy, len(pattern)), slots_of(pattern))

    def _plan(self, strategy: str, pattern: Pattern) -> float:
        self.planned += 1
        with gc_paused():
            try:
                layout = self.layout(strategy, pattern)
            except LayoutError:
                return float("inf")
            return self.layout_step(layout, schedule_of(strategy))

    def layout_step(self, layout: Layout, schedule: str) -> float:
        """The longest group's step; each distinct group replayed once (see the module notes)."""
        pipelines = len(set(layout.pipeline_of))
        worst = 0.0
        for part in set(independent_parts(layout)):
            scale = max(1, round(pipelines / len(set(part.pipeline_of))))
            key = (part, schedule, scale)
            found = self.groups.get(key)
            if found is None:
                try:
                    found = self.cost.step_time(part, schedule=schedule, allreduce_scale=scale)
                except ScheduleError:
                    found = float("inf")
                self.groups[key] = found
            worst = max(worst, found)
        return worst

    def exact_step(self, strategy: str, pattern: Pattern) -> float:
        """The same plan replayed whole, with no cache and no grouping (the reference for tests)."""
        try:
            layout = self.layout(strategy, pattern)
        except LayoutError:
            return float("inf")
        return self.cost.step_time(layout, schedule=schedule_of(strategy))
