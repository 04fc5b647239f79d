"""Spare joiners: more replacements than empty slots.

A joiner the plan has no slot for is listed in the plan's `spare`; it learns that at once (the
`spare/<node>` key) and stands by outside the group, heartbeating, until a later generation takes
it to fill a hole. Before, nothing told it: it waited for `joined/<node>` until the job ended or
its rendezvous timeout (60 s) ran out, and no later generation considered it."""

from __future__ import annotations

import pytest

from runtime.config import DeviceTime
from runtime.distributed.membership import initial_plan, make_plan
from runtime.train.launcher import Fault, Join, RunResult, run_local
from tests.runtime.conftest import assert_same_math, small_config


def events(result: RunResult, name: str) -> list[dict]:
    return [r for r in result.records if r.get("event") == name]


def _record(committed: int, layers: list[int]) -> dict:
    return {"committed": committed, "versions": {str(i): committed for i in layers}, "leaving": False}


def test_plan_lists_joiners_without_a_slot_as_spares_and_fills_the_next_hole_with_them() -> None:
    config = small_config(strategy="recycle", schedule="fiw")
    start = initial_plan(config)
    stage0, stage1 = [0, 1, 2], [3]  # the tiny MLP's 4 layers in DP=2 x PP=2
    alive = {0: _record(3, stage0), 2: _record(3, stage0), 3: _record(3, stage1)}  # node 1 died
    lost = make_plan(config, generation=1, previous=start, alive=alive, joiners=[], checkpoint_step=None,
                     reason="failure")
    assert lost.lost == [1] and lost.spare == []
    both = make_plan(config, generation=2, previous=lost, alive=alive, joiners=[4, 5], checkpoint_step=None,
                     reason="join")
    assert both.joined == [4] and both.spare == [5] and 5 not in both.members
    assert both.joins_consumed == 2
    # Node 2 dies later: the spare (still alive, passed back by the deciding member) fills its slot;
    # it is not a new join request, so `joins_consumed` does not move.
    alive = {0: _record(6, stage0), 3: _record(6, stage1), 4: _record(6, stage1)}
    later = make_plan(config, generation=3, previous=both, alive=alive, joiners=[], checkpoint_step=None,
                      reason="failure", spares=[5])
    assert later.lost == [2] and later.joined == [5] and later.spare == []
    assert later.slots == [[0, 4], [5, 3]]
    assert later.joins_consumed == 2
    assert later.transfers == [(layer, 0, 5) for layer in stage0]  # the spare fetches stage 0


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize("second", ["kill", "notice"])
def test_spare_learns_its_role_at_once_and_fills_a_later_hole_with_the_same_math(second: str) -> None:
    # DP=2 x PP=2: node 1 killed, two replacements for its one slot; then node 2 is lost (killed,
    # or leaves on a notice and hands its stage over) and the spare takes its slot.
    config = small_config(strategy="recycle", schedule="fiw", steps=18, device_time=DeviceTime(forward_ms=4.0))
    result = run_local(
        config,
        faults=[Fault(node=1, kind="kill", step=1), Fault(node=2, kind=second, step=12)],
        joins=[Join(node=4, after_step=2), Join(node=5, after_step=4)],
        timeout_s=100,
    )
    assert_same_math(result, config)
    spares = events(result, "spare")
    assert len(spares) == 1, spares  # exactly one joiner found no slot, and it was told so
    spare = spares[0]["node"]
    designated = spares[0]["generation"]
    # It was told by the generation running when it asked, which had no slot for it; the members
    # did not regroup to say so (the only generation formed for a join is the one that took node 4).
    generations = [e for e in events(result, "generation") if e["node"] == 0]
    plan_members = {e["generation"]: e["members"] for e in generations}
    assert spare not in plan_members[designated] and len(plan_members[designated]) == 4
    assert [e["members"] for e in generations if e["reason"] == "join"] == [[0, 2, 3, 4]]
    # The others trained on without it in between (no regroup waited for it) ...
    taken = [e for e in events(result, "generation") if e["node"] == spare]
    assert taken and taken[0]["generation"] > designated and len(taken[0]["members"]) == 4
    assert 2 not in taken[0]["members"] and spare in taken[0]["members"]
    # ... and it commits with them to the end, exiting cleanly.
    steps = [r["step"] for r in result.steps() if r["node"] == spare]
    assert steps and steps[-1] == config.steps - 1
    assert result.exit_codes[spare] == 0 and result.exit_codes[1] == -9
    assert result.exit_codes[2] == (-9 if second == "kill" else 0)


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_unused_spare_ends_with_the_job() -> None:
    config = small_config(strategy="recycle", schedule="fiw", steps=10, device_time=DeviceTime(forward_ms=4.0))
    result = run_local(
        config,
        faults=[Fault(node=1, kind="kill", step=1)],
        joins=[Join(node=4, after_step=2), Join(node=5, after_step=4)],
        timeout_s=100,
    )
    assert_same_math(result, config)
    spare = events(result, "spare")
    assert [e["node"] for e in spare] == [5]
    joins = [e for e in events(result, "generation") if e["node"] == 0 and e["reason"] == "join"]
    assert [e["members"] for e in joins] == [[0, 2, 3, 4]]  # no regroup to tell the spare
    assert [e["node"] for e in events(result, "join_too_late")] == [5]  # told when the job was done
    assert result.exit_codes[5] == 0 and not [r for r in result.steps() if r["node"] == 5]
