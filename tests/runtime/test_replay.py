"""The simulator's fast path (`step_end` in `CostModel.step_time`; `schedule_rows` + `replay_end`) gives the
reference's action lists and bit-identical step lengths, on many small random layouts."""

from __future__ import annotations

import random

import pytest

from runtime.parallel.schedule import (
    ScheduleError,
    build_schedule,
    replay_end,
    schedule_rows,
    stage_durations,
    step_end,
)
from runtime.parallel.throughput import CostModel, Network
from tests.runtime._reference_schedule import reference_build_schedule, reference_step_time
from tests.runtime.test_list_schedule import random_layouts

pytestmark = pytest.mark.timeout(60)


def random_cost(rng: random.Random, layers: int) -> CostModel:
    """Irregular per-layer costs and sizes, so float rounding differs between summation orders."""
    return CostModel(
        fiw=[tuple(rng.uniform(0.0, 3e-3) for _ in range(3)) for _ in range(layers)],
        output_bytes=[rng.uniform(1e3, 1e7) for _ in range(layers)],
        param_bytes=[rng.uniform(1e3, 1e8) for _ in range(layers)],
        network=Network(bandwidth_gbps=rng.choice([1.0, 10.0, 25.0]), latency_s=rng.choice([0.0, 5e-5])),
        compute_scale=rng.choice([1.0, 1.7]),
        step_overhead_s=rng.choice([0.0, 0.01]),
    )


@pytest.mark.parametrize("seed", range(3))
def test_action_lists_equal_the_reference(seed: int) -> None:
    for layout, kind, durations in random_layouts(seed, 40):
        assert build_schedule(layout, kind, durations) == reference_build_schedule(layout, kind, durations), (
            layout,
            kind,
        )


@pytest.mark.parametrize("seed", range(4))
def test_step_time_is_bit_identical_to_the_reference_replay(seed: int) -> None:
    rng = random.Random(100 + seed)
    compared = 0
    for layout, kind, _ in random_layouts(seed, 40):
        cost = random_cost(rng, layout.num_layers)
        scale = rng.choice([1, 3])
        try:
            expected = reference_step_time(cost, layout, kind, scale)
        except ScheduleError:
            with pytest.raises(ScheduleError):
                cost.step_time(layout, schedule=kind, allreduce_scale=scale)
            continue
        assert cost.step_time(layout, schedule=kind, allreduce_scale=scale) == expected, (layout, kind)
        compared += 1
    assert compared > 20


def test_rows_are_the_actions_fields() -> None:
    for layout, kind, durations in random_layouts(9, 10):
        rows = schedule_rows(layout, kind, durations)
        actions = build_schedule(layout, kind, durations)
        assert {
            n: [(a.kind, a.stage, a.microbatch, a.peer, a.pipeline, a.layers, a.group) for a in acts]
            for n, acts in actions.items()
        } == rows


@pytest.mark.parametrize("seed", range(4))
def test_step_end_equals_the_replay_of_the_rows_when_costs_tie(seed: int) -> None:
    """`step_end` (what `CostModel.step_time` runs: one pass over the list schedule's picks, no rows)
    against `replay_end(schedule_rows(...))` directly, under costs that tie often (few distinct layer
    times, equal sizes), so receives, all-reduce issues and optimizer steps tie, bamboo's replica
    runs and recycle's spill hosts included: ties are where the two could order the optimizer steps
    differently (a bug of that kind was found by such a comparison while `step_end` was written)."""
    rng = random.Random(300 + seed)
    compared = 0
    for layout, kind, _ in random_layouts(seed + 20, 60):
        layers = layout.num_layers
        cost = CostModel(
            fiw=[tuple(rng.choice([0.0, 1e-3, 2e-3]) for _ in range(3)) for _ in range(layers)],
            output_bytes=[1e6] * layers,
            param_bytes=[1e7] * layers,
            network=Network(bandwidth_gbps=10.0, latency_s=rng.choice([0.0, 5e-5])),
        )
        scale = rng.choice([1, 2])
        durations = stage_durations(layout, cost.fiw)
        prices = cost.action_prices(layout, allreduce_scale=scale)
        try:
            expected = replay_end(schedule_rows(layout, kind, durations), *prices)
        except ScheduleError:
            with pytest.raises(ScheduleError):
                step_end(layout, kind, durations, lambda p=prices: p)
            continue
        assert step_end(layout, kind, durations, lambda p=prices: p) == expected, (layout, kind)
        compared += 1
    assert compared > 30
