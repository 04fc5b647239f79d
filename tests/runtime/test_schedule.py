"""Pure tests (no process group): partitioning, layout validation, schedules as data."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.parallel.layout import pipelines_layout, split_microbatches
from runtime.parallel.partition import partition_layers
from runtime.parallel.schedule import (
    COMPUTE,
    OPTIMIZER,
    Action,
    ScheduleError,
    action_duration,
    build_schedule,
    format_grid,
    schedule_length,
    simulate,
    validate_schedule,
)
from runtime.strategies import initial_layout

pytestmark = pytest.mark.timeout(30)


def config(**kw) -> JobConfig:
    base = dict(dp=2, pp=4, microbatches=4, global_batch=32, model=ModelSpec(n_layer=6))
    base.update(kw)
    return JobConfig(**base)


def test_partition_balances_cost() -> None:
    assert partition_layers([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert partition_layers([4, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert partition_layers([1.0] * 5, 5) == [(i, i + 1) for i in range(5)]


def test_a_layer_without_parameters_joins_the_next_layers_stage_and_trailing_ones_the_last() -> None:
    held = [0, 5, 0, 0, 5, 5, 0]  # free first, inside, last
    assert partition_layers([1.0] * 7, 3, parameters=held) == [(0, 2), (2, 5), (5, 7)]
    assert partition_layers([1.0] * 7, 1, parameters=held) == [(0, 7)]
    # Costs still balance, over the groups: the heavy free layer goes with the layer after it.
    assert partition_layers([1.0, 1.0, 9.0, 1.0, 1.0], 2, parameters=[3, 3, 0, 3, 3]) == [(0, 2), (2, 5)]
    with pytest.raises(LayoutError, match=r"only 3 of them hold parameters .* expected at most 3 stages"):
        partition_layers([1.0] * 7, 4, parameters=held)
    with pytest.raises(LayoutError, match=r"no layer of the model holds parameters"):
        partition_layers([1.0, 1.0], 1, parameters=[0, 0])


def test_partition_rejects_more_stages_than_layers() -> None:
    with pytest.raises(LayoutError, match=r"3 layers into 4 stages"):
        partition_layers([1, 1, 1], 4)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(pp=9), r"pp=9 stages but the model has only 8 layers"),
        (dict(global_batch=30), r"global_batch=30 is not divisible by dp\*microbatches=8"),
        (dict(strategy="magic"), r"strategy 'magic' is unknown"),
        (dict(model=ModelSpec(kind="gpt", n_embd=30, n_head=4)), r"n_embd=30 is not divisible by n_head=4"),
        (dict(layer_costs=[1.0, 2.0]), r"layer_costs has 2 entries; expected 8"),
    ],
)
def test_bad_config_names_value_and_expectation(kw: dict, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        config(**kw).validate()


def test_config_round_trips_through_json_dict() -> None:
    c = config(strategy="recycle")
    assert JobConfig.from_dict(c.to_dict()) == c


def test_split_microbatches_keeps_total() -> None:
    assert split_microbatches(8, [4, 4]) == [4, 4]
    assert split_microbatches(8, [4, 3]) == [5, 3]
    assert sum(split_microbatches(13, [3, 2, 2])) == 13


def test_initial_layout_routes() -> None:
    layout = initial_layout(config())
    assert layout.nodes() == tuple(range(8))
    assert layout.routes[0] == ((0, 0), (1, 1), (2, 2), (3, 3))
    assert layout.routes[7] == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert [owners for _, _, owners in layout.owner_runs()] == [(0, 4), (1, 5), (2, 6), (3, 7)]


@pytest.mark.parametrize("kind", ["1f1b", "fiw"])
@pytest.mark.parametrize(("dp", "pp", "m"), [(1, 1, 1), (2, 2, 4), (2, 4, 4), (1, 4, 8)])
def test_schedules_are_complete_and_deadlock_free(kind: str, dp: int, pp: int, m: int) -> None:
    layout = initial_layout(config(dp=dp, pp=pp, microbatches=m, global_batch=dp * m * 2))
    schedule = build_schedule(layout, kind)
    validate_schedule(layout, schedule, kind)
    for acts in schedule.values():
        assert acts[-1].kind == OPTIMIZER


def compute_order(schedule: dict[int, list[Action]], node: int) -> list[str]:
    return [f"{a.kind}{a.microbatch}" for a in schedule[node] if a.kind in COMPUTE]


def test_1f1b_warms_up_then_alternates() -> None:
    layout = initial_layout(config(dp=1, pp=4, microbatches=6, global_batch=12, model=ModelSpec(n_layer=2)))
    schedule = build_schedule(layout, "1f1b")
    assert compute_order(schedule, 0) == [
        "F0",
        "F1",
        "F2",
        "F3",
        "B0",
        "F4",
        "B1",
        "F5",
        "B2",
        "B3",
        "B4",
        "B5",
    ]
    assert compute_order(schedule, 3)[:6] == ["F0", "B0", "F1", "B1", "F2", "B2"]


def test_split_backward_shortens_the_step() -> None:
    layout = initial_layout(config(dp=1, pp=4, microbatches=8, global_batch=16, model=ModelSpec(n_layer=2)))
    ends = {}
    for kind in ("1f1b", "fiw"):
        timeline = simulate(build_schedule(layout, kind), action_duration(layout))
        ends[kind] = max(e for row in timeline.values() for _, e, _ in row)
    assert ends["fiw"] < ends["1f1b"]


def test_validator_catches_missing_receive_and_duplicates() -> None:
    layout = initial_layout(config(dp=1, pp=2, microbatches=2, global_batch=4))
    schedule = build_schedule(layout)
    broken = {
        n: [a for a in acts if not (n == 1 and a.kind == "RECV_F" and a.microbatch == 1)]
        for n, acts in schedule.items()
    }
    with pytest.raises(ScheduleError):
        validate_schedule(layout, broken)
    doubled = dict(schedule)
    doubled[0] = [*schedule[0], Action("F", 0, 0)]
    with pytest.raises(ScheduleError, match="appears twice"):
        validate_schedule(layout, doubled)


def test_action_is_small_frozen_data() -> None:
    act = Action("F", stage=1, microbatch=2, pipeline=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        act.stage = 3  # type: ignore[misc]
    assert {act, Action("F", stage=1, microbatch=2, pipeline=0)} == {act}
    assert str(act) == "F2s1"


def test_grid_has_a_row_per_node_and_marks_bubbles() -> None:
    layout = initial_layout(config(dp=1, pp=2, microbatches=2, global_batch=4, model=ModelSpec(n_layer=2)))
    grid = format_grid(build_schedule(layout), action_duration(layout))
    lines = grid.splitlines()
    assert len(lines) == 3
    assert lines[1].split("|")[1].split()[:2] == ["F0", "F0"]  # stage 0 has 2 layers: 2 time units
    assert "." in lines[2]


def test_heterogeneous_pipelines_schedule() -> None:
    c = config(dp=2, pp=4)
    layout = pipelines_layout(c, [[0, 1, 2, 3], [4, 5, 6]])
    assert sum(1 for p in layout.pipeline_of if p == 0) == 5
    validate_schedule(layout, build_schedule(layout, "fiw"), "fiw")


def test_send_latency_delays_each_hop_and_schedule_length_matches_the_replay() -> None:
    # One micro-batch through 4 stages: 3 activations forward and 3 gradients back, one after another.
    layout = initial_layout(config(dp=1, pp=4, microbatches=1, global_batch=2))
    for kind in ("1f1b", "fiw"):
        schedule = build_schedule(layout, kind)

        def end(latency: float, schedule=schedule) -> float:
            timeline = simulate(schedule, action_duration(layout), send_latency=latency)
            return max(e for row in timeline.values() for _, e, _ in row)

        assert end(0.5) == pytest.approx(end(0.0) + 6 * 0.5)
        assert schedule_length(layout, kind) == pytest.approx(end(0.0))
