"""Joiner batching (issue 20): for a strategy whose regroup is a restart from the checkpoint or a
re-instantiation, a joiner that finds an empty slot waits -- told to stand by, heartbeating -- until
the joiners waiting fill every empty slot or one more full pipeline, or until the oldest has waited
`join_batch_wait_s`; cheap strategies take every joiner at once. One rule
(`membership.joiners_worth_a_regroup`), asked by the worker's first member at each step and by the
simulator. Real processes on gloo for checkpoint; same math as the failure-free run."""

from __future__ import annotations

import pytest

from runtime.config import DeviceTime, LayoutError
from runtime.distributed.generation_plan import GenerationPlan
from runtime.distributed.membership import joiners_worth_a_regroup, make_plan
from runtime.train.launcher import Fault, Join, RunResult, run_local
from tests.runtime.conftest import assert_same_math, small_config


def _worth(strategy: str, **kw) -> bool:
    args = dict(pp=4, filled=8, empty=8, waiting=1, waited_s=0.0, wait_bound_s=300.0)
    args.update(kw)
    return joiners_worth_a_regroup(strategy, **args)


@pytest.mark.parametrize("strategy", ["recycle", "bamboo"])
def test_cheap_regroups_take_every_joiner_at_once(strategy: str) -> None:
    assert _worth(strategy, waiting=1)
    assert not _worth(strategy, waiting=0)
    assert not _worth(strategy, empty=0, filled=16)  # no slot: it stands by


@pytest.mark.parametrize("strategy", ["checkpoint", "oobleck"])
def test_costly_regroups_wait_for_a_batch_worth_it(strategy: str) -> None:
    # 2 x 4 of a 4 x 4 grid filled, 8 empty slots.
    assert not _worth(strategy, waiting=1)
    assert not _worth(strategy, waiting=3)
    assert _worth(strategy, waiting=4)  # one more full pipeline
    assert _worth(strategy, waiting=1, filled=11, empty=5)  # completes the third pipeline
    assert _worth(strategy, waiting=2, filled=14, empty=2)  # fills every empty slot
    assert _worth(strategy, waiting=1, waited_s=300.0)  # the oldest waited the bound
    assert not _worth(strategy, waiting=1, waited_s=299.9)
    assert _worth(strategy, waiting=1, waited_s=0.0, wait_bound_s=0.0)  # 0: no batching
    assert _worth(strategy, waiting=1, urgent=True)  # the job cannot run (or a deferred node waits) without it
    assert not _worth(strategy, waiting=1, empty=0, filled=16, waited_s=1e9)  # no slot: it stands by
    assert not _worth(strategy, waiting=0, urgent=True)


def test_the_wait_bound_is_validated() -> None:
    small_config(join_batch_wait_s=0.0).validate()
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(LayoutError, match="join_batch_wait_s"):
            small_config(join_batch_wait_s=bad).validate()


def test_a_joiner_found_dead_is_consumed_but_not_placed() -> None:
    config = small_config(strategy="checkpoint")
    previous = GenerationPlan(generation=1, slots=[[0, None], [2, None]], members=[0, 2])
    alive = {n: {"committed": 4, "versions": {}, "leaving": False} for n in (0, 2)}
    plan = make_plan(config, generation=2, previous=previous, alive=alive, joiners=[4, 5], checkpoint_step=2,
                     reason="join", gone_joiners=[4])
    assert plan.joins_consumed == 2 and plan.joined == [5]
    assert 4 not in plan.members and plan.slots == [[0, 5], [2, None]]


def _events(result: RunResult, name: str, node: int | None = None) -> list[dict]:
    return [r for r in result.records if r.get("event") == name and (node is None or r["node"] == node)]


def _checkpoint_job(tmp_path, wait_bound_s: float, joins: list[Join]) -> tuple[RunResult, object]:
    # DP=2 x PP=2: nodes 1 and 3 (stage 1 of both pipelines) die at step 3; the survivors 0 and 2
    # restart from the checkpoint of step 2 as one pipeline, two slots empty.
    config = small_config(strategy="checkpoint", steps=72, checkpoint_interval=2, checkpoint_dir=str(tmp_path),
                          device_time=DeviceTime(forward_ms=4.0), join_batch_wait_s=wait_bound_s)
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=3), Fault(node=3, kind="kill", step=3)],
                       joins=joins, timeout_s=100)
    assert result.exit_codes[1] == -9 and result.exit_codes[3] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (1, 3)), result.exit_codes
    assert_same_math(result, config)
    assert not _events(result, "job_failed")
    return result, config


def _steps_of_0_between(result: RunResult, a: float, b: float) -> list[int]:
    return [r["step"] for r in result.steps() if r["node"] == 0 and a < r["time"] < b]


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_checkpoint_holds_a_lone_joiner_until_a_second_fills_the_empty_slots(tmp_path) -> None:
    result, config = _checkpoint_job(tmp_path, 60.0, [Join(node=4, time_s=1.0), Join(node=5, time_s=3.0)])
    asked = {e["node"]: e["time"] for e in _events(result, "join_requested")}
    first, second = sorted(asked, key=asked.get)
    # The first joiner was told to stand by (one of two empty slots, no new pipeline) ...
    assert [e["node"] for e in _events(result, "spare")] == [first]
    # ... the job trained on without a regroup until the second asked, then took both in one regroup.
    joins = [e for e in _events(result, "generation", node=0) if e["reason"] == "join"]
    assert len(joins) == 1 and {4, 5} <= set(joins[0]["members"]), joins
    assert joins[0]["time"] > asked[second]
    assert _steps_of_0_between(result, asked[first], asked[second]), "the job stopped for the lone joiner"
    assert [r["step"] for r in result.steps() if r["node"] == first][-1] == config.steps - 1


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_checkpoint_takes_a_lone_joiner_once_it_waited_the_bound(tmp_path) -> None:
    result, config = _checkpoint_job(tmp_path, 1.5, [Join(node=4, time_s=1.0)])
    (asked,) = _events(result, "join_requested", node=4)
    assert _events(result, "spare", node=4)  # held first
    joins = [e for e in _events(result, "generation", node=0) if e["reason"] == "join"]
    assert len(joins) == 1 and 4 in joins[0]["members"], joins
    assert joins[0]["time"] - asked["time"] >= 1.5  # not before the bound
    assert _steps_of_0_between(result, asked["time"], joins[0]["time"]), "the job stopped for the lone joiner"
    assert [r["step"] for r in result.steps() if r["node"] == 4][-1] == config.steps - 1
