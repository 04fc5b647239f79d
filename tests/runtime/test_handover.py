"""A notice for the last holder of a stage, before its replacement has joined: the node stays
(deferred) and keeps training until the replacement joins, then hands its parameters and optimizer
state over at the step boundary -- same math. When no replacement can come (the last holder is
killed), every worker exits with a named reason instead of hanging. Real processes on gloo.

Recycle runs peers-only here (`recycle_spill=False`): with spill, the default, an earlier spill host
may hold a copy of the leaver's stage, so the leaver is not the last holder and just leaves
(`tests/runtime/test_failures.py` covers that)."""

from __future__ import annotations

import pytest

from runtime.config import DeviceTime
from runtime.distributed.generation_plan import GenerationPlan
from runtime.distributed.membership import make_plan
from runtime.train.launcher import Fault, Join, run_local
from tests.runtime.conftest import assert_same_math, small_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(90)]


def _events(result, name: str) -> list[dict]:
    return [r for r in result.records if r.get("event") == name]


def _record(layers: list[int], *, leaving: bool = False, step: int = 3) -> dict:
    return {"committed": step, "versions": {str(k): step for k in layers}, "leaving": leaving}


STAGE0, STAGE1 = [0, 1, 2], [3]  # the layers of small_config's two stages


def test_plan_defers_the_last_holder_of_a_stage_until_a_replacement_joins() -> None:
    config = small_config(strategy="recycle", recycle_spill=False)
    # Node 2 (pipeline 1, stage 0) is already gone; node 0 holds the only copy of stage 0.
    previous = GenerationPlan(generation=1, slots=[[0, 1], [None, 3]], members=[0, 1, 3])
    alive = {0: _record(STAGE0, leaving=True), 1: _record(STAGE1), 3: _record(STAGE1)}
    plan = make_plan(
        config, generation=2, previous=previous, alive=alive, joiners=[], checkpoint_step=None, reason="notice"
    )
    assert plan.error is None
    assert plan.deferred == [0] and plan.leaving == [] and 0 in plan.members

    # The replacement arrives: node 0 leaves now and sends it stage 0's layer.
    joined = make_plan(
        config, generation=3, previous=plan, alive=alive, joiners=[4], checkpoint_step=None, reason="join"
    )
    assert joined.error is None
    assert joined.leaving == [0] and joined.deferred == [] and 4 in joined.members
    assert joined.transfers == [(layer, 0, 4) for layer in STAGE0]

    # A notice for a node the job can do without is not deferred.
    alive = {0: _record(STAGE0), 1: _record(STAGE1, leaving=True), 3: _record(STAGE1)}
    plan = make_plan(
        config, generation=2, previous=previous, alive=alive, joiners=[], checkpoint_step=None, reason="notice"
    )
    assert plan.leaving == [1] and plan.deferred == []


def test_notice_before_the_replacement_joined_hands_over_and_keeps_the_math() -> None:
    # 18 steps: the replacement, started after step 7, must be in before the last one even when a
    # loaded machine takes a second to start it (with 14 it came too late once, at load 10).
    config = small_config(strategy="recycle", recycle_spill=False, schedule="fiw", steps=18,
                          device_time=DeviceTime(forward_ms=4.0))
    # Node 2 dies; node 0 (now the only stage-0 holder) gets a notice at step 3; the replacement
    # only starts after step 6, i.e. several steps after the notice.
    result = run_local(
        config,
        faults=[Fault(node=2, kind="kill", step=1), Fault(node=0, kind="notice", step=3)],
        joins=[Join(node=4, after_step=7)],
        timeout_s=80,
    )
    assert result.exit_codes[2] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node != 2), result.exit_codes
    assert_same_math(result, config)
    deferred = [e for e in _events(result, "generation") if e["deferred"] == [0]]
    assert deferred, "node 0 was not kept after its notice"
    assert [e["node"] for e in _events(result, "left")] == [0]
    node0_steps = [r["step"] for r in result.steps() if r["node"] == 0]
    assert max(node0_steps) >= 6  # it trained on after its notice at step 3, until the replacement came
    assert [r["step"] for r in result.steps() if r["node"] == 4][-1] == config.steps - 1
    assert not _events(result, "job_failed")


def test_last_holder_of_a_stage_killed_fails_the_job_with_a_named_reason() -> None:
    config = small_config(strategy="recycle", recycle_spill=False, schedule="fiw", steps=10,
                          device_time=DeviceTime(forward_ms=4.0))
    result = run_local(
        config, faults=[Fault(node=2, kind="kill", step=1), Fault(node=0, kind="kill", step=3)], timeout_s=80
    )
    assert result.exit_codes[0] == -9 and result.exit_codes[2] == -9
    assert result.exit_codes[1] != 0 and result.exit_codes[3] != 0  # they exit: no hang, no false "done"
    failures = _events(result, "job_failed")
    assert sorted(e["node"] for e in failures) == [1, 3]
    assert all("no surviving node for stage 0" in e["reason"] for e in failures), failures


THREE_KILLED_AT_STEP_3 = [Fault(node=n, kind="kill", step=3) for n in (0, 1, 2)]
"""All of pipeline 0 and node 2: the one survivor cannot fill a pipeline."""


def _checkpoint_config(tmp_path, **kw):
    return small_config(strategy="checkpoint", steps=10, checkpoint_interval=2, checkpoint_dir=str(tmp_path),
                        device_time=DeviceTime(forward_ms=4.0), **kw)


def test_checkpoint_survivors_too_few_for_a_pipeline_wait_for_replacements(tmp_path) -> None:
    # Nodes 0 and 1 (all of pipeline 0) and node 2 die: one survivor cannot fill a pipeline. Under a
    # strategy that restarts from its checkpoint it waits; two replacements join and the job goes on
    # from the last checkpoint with the same math.
    config = _checkpoint_config(tmp_path)
    result = run_local(
        config,
        faults=THREE_KILLED_AT_STEP_3,
        joins=[Join(node=4, time_s=4.0), Join(node=5, time_s=4.5)],
        timeout_s=80,
    )
    assert_same_math(result, config)
    waited = [
        e for e in _events(result, "generation") if e["node"] == 3 and 4 not in e["members"] and e["generation"] > 0
    ]
    assert waited, "the survivor did not hold a generation on its own"
    restarted = [e for e in _events(result, "generation") if e["node"] == 4]
    assert restarted and restarted[0]["start_step"] == 2  # the checkpoint before the kills at step 3
    assert not _events(result, "job_failed")


def test_waiting_for_replacements_is_bounded(tmp_path) -> None:
    config = _checkpoint_config(tmp_path, join_wait_s=1.0)
    result = run_local(
        config,
        faults=THREE_KILLED_AT_STEP_3,
        timeout_s=60,
    )
    (failed,) = _events(result, "job_failed")
    assert failed["node"] == 3 and "waited 1 s for replacements" in failed["reason"]
    assert result.exit_codes[3] != 0
