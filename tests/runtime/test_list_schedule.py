"""The heap-based list scheduler picks exactly what the scan-based one did, on many small layouts."""

from __future__ import annotations

import random

import pytest

from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.parallel.layout import Layout
from runtime.parallel.schedule import _list_schedule, independent_parts, schedule_length, stage_durations
from runtime.strategies import get_strategy
from runtime.strategies.base import full_slots
from tests.runtime._reference_schedule import reference_list_schedule

pytestmark = pytest.mark.timeout(60)


def random_layouts(seed: int, count: int) -> list[tuple[Layout, str, dict]]:
    """Layouts of every strategy with random losses, random per-layer (F, I, W) costs."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        dp, pp, m = rng.randint(1, 4), rng.randint(1, 5), rng.randint(1, 5)
        name = rng.choice(["none", "bamboo", "recycle", "oobleck", "checkpoint"])
        kind = rng.choice(["1f1b", "fiw"])
        config = JobConfig(
            model=ModelSpec(n_layer=6),
            dp=dp,
            pp=pp,
            microbatches=m,
            global_batch=dp * m,
            strategy=name,
            schedule=kind,
            recycle_spill=rng.random() < 0.3,
        )
        slots = full_slots(config)
        if name != "none":
            for _ in range(rng.randint(0, dp * pp - 1)):
                slots[rng.randrange(dp)][rng.randrange(pp)] = None
        try:
            layout = get_strategy(name).layout_for(config, slots)
        except LayoutError:
            continue
        costs = [tuple(rng.choice([0.0, 0.5, 1.0, 1.5, 2.0]) for _ in range(3)) for _ in range(layout.num_layers)]
        out.append((layout, kind, stage_durations(layout, costs if rng.random() < 0.8 else None)))
    return out


def picks(order: dict) -> dict:
    return {node: [(start, t.kind, t.mb, t.hop) for start, t in row] for node, row in order.items() if row}


@pytest.mark.parametrize("seed", range(4))
def test_heap_list_schedule_equals_the_scan(seed: int) -> None:
    for layout, kind, durations in random_layouts(seed, 40):
        assert picks(_list_schedule(layout, kind, durations)) == picks(
            reference_list_schedule(layout, kind, durations)
        ), (layout, kind, durations)


def test_schedule_length_of_independent_groups_equals_the_whole_schedule() -> None:
    for layout, kind, durations in random_layouts(7, 60):
        whole = _list_schedule(layout, kind, durations)
        expected = max((start + t.duration for row in whole.values() for start, t in row), default=0.0)
        assert schedule_length(layout, kind, durations) == expected, (layout, kind)


def test_identical_pipelines_are_one_group_shape() -> None:
    config = JobConfig(
        dp=16, pp=4, microbatches=4, global_batch=64, strategy="recycle", schedule="fiw", recycle_spill=False
    )
    slots = [[None if n == 5 else n for n in row] for row in full_slots(config)]
    layout = get_strategy("recycle").layout_for(config, slots)
    parts = independent_parts(layout)
    # Pipeline 1 lost node 5: its stage-1 hops went to pipelines 0, 2, 3 and 4 (round-robin), which
    # form one group with it; the 11 untouched pipelines are 11 copies of one shape.
    assert sorted(p.num_microbatches for p in parts) == [4] * 11 + [20]
    assert len(set(parts)) == 2
    whole = _list_schedule(layout, "fiw", stage_durations(layout))
    assert schedule_length(layout, "fiw") == max(s + t.duration for row in whole.values() for s, t in row)


def test_owner_runs_are_each_layers_holders() -> None:
    for layout, _, _ in random_layouts(5, 60):
        runs = layout.owner_runs()
        assert [lo for lo, _, _ in runs] == [0] + [hi for _, hi, _ in runs[:-1]]
        assert runs[-1][1] == layout.num_layers
        for lo, hi, owners in runs:
            for layer in range(lo, hi):
                assert owners == tuple(n for n in layout.nodes() if layer in layout.layers_of(n))
