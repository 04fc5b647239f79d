"""A node SIGKILLed *during* a state hand-over (real processes on gloo; recycle peers-only, as in
tests/runtime/test_handover.py).

The setting is the deferred hand-over of tests/runtime/test_handover.py: DP=2 x PP=2 recycle, node 2
killed at step 1 leaves node 0 the only holder of stage 0; node 0 gets a notice at step 3 and stays
(deferred) until replacement 4 joins, then sends it stage 0's three layers. A fault with phase
"transfer" kills one node at a given message of that hand-over:

- the receiver (mid-transfer, or after its last message): node 0 still holds the state, stays
  deferred, and either hands over to a later replacement or trains to the end -- same math;
- a third node, not in the hand-over, while it is under way: the hand-over is given up and redone
  (or not needed any more) in the next generation -- same math;
- the leaver, mid-transfer: the only copy of part of stage 0 is gone, so every survivor (the
  replacement too) fails with `JobCannotContinue` naming the missing layer, without waiting for a
  timeout;
- and, in a plain join (DP=3), the source killed mid-transfer while another node holds the same
  stage: that node sends it in the next generation -- same math.
"""

from __future__ import annotations

import pytest

from runtime.config import DeviceTime, JobConfig, ModelSpec
from runtime.distributed.generation_plan import GenerationPlan
from runtime.distributed.membership import make_plan
from runtime.strategies import initial_layout
from runtime.train.launcher import Fault, Join, RunResult, run_local
from tests.runtime.conftest import assert_same_math, small_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(90)]

STAGE0 = (0, 1, 2)  # small_config's stage 0: input layer and the two hidden layers
SETUP = [Fault(node=2, kind="kill", step=1), Fault(node=0, kind="notice", step=3)]


def _config(steps: int = 16):
    # Joins come at step 5 or 9 and must be in before the last step even on a loaded machine.
    return small_config(strategy="recycle", recycle_spill=False, schedule="fiw", steps=steps,
                        device_time=DeviceTime(forward_ms=4.0))


def _kill_in_transfer(config, *, node: int, at: int) -> RunResult:
    """The deferred hand-over of SETUP to replacement 4, with `node` SIGKILLed before its transfer
    message `at`."""
    faults = [*SETUP, Fault(node=node, kind="kill", phase="transfer", at=at)]
    return run_local(config, faults=faults, joins=[Join(node=4, after_step=5)], timeout_s=80)


def dp3_config(**overrides) -> JobConfig:
    """DP=3 x PP=2 recycle (peers only), 6 layers: stage 1 has two holders besides the lost node."""
    return small_config(
        strategy="recycle",
        recycle_spill=False,
        schedule="fiw",
        dp=3,
        global_batch=12,
        steps=14,
        model=ModelSpec(n_layer=4),
        device_time=DeviceTime(forward_ms=4.0),
        **overrides,
    )


def _events(result: RunResult, name: str) -> list[dict]:
    return [r for r in result.records if r.get("event") == name]


def _steps(result: RunResult, node: int) -> list[int]:
    return [r["step"] for r in result.steps() if r["node"] == node]


def _assert_no_timeout(result: RunResult) -> None:
    """Every failure was seen through a closed connection, a dead mark or an abort, none by waiting
    for a timeout (the failures come from kills, so nothing should have had to)."""
    for event in _events(result, "failure_detected"):
        assert "Timed out" not in event["reason"] and "within" not in event["reason"], event


def _injected_in_transfer(result: RunResult, node: int) -> None:
    assert [e["phase"] for e in _events(result, "inject_kill") if e["node"] == node] == ["transfer"]


def test_plan_gives_a_leaver_whose_handover_failed_its_slot_back_and_defers_it() -> None:
    config = small_config(strategy="recycle", recycle_spill=False)
    # Generation 3 was the hand-over: node 0 leaving, replacement 4 in the stage-0 slot of pipeline 0.
    handover = GenerationPlan(generation=3, slots=[[4, 1], [None, 3]], members=[4, 1, 3], leaving=[0],
                              joins_consumed=1)
    holding = {"committed": 6, "versions": {"0": 6, "1": 6, "2": 6}, "leaving": True}
    stage1 = {"committed": 6, "versions": {"3": 6}, "leaving": False}
    # Node 4 died mid-transfer: node 0 is back where its layers are, deferred, nothing to send.
    plan = make_plan(
        config,
        generation=4,
        previous=handover,
        alive={0: holding, 1: stage1, 3: stage1},
        joiners=[],
        checkpoint_step=None,
        reason="hand-over failed",
    )
    assert plan.error is None, plan
    assert plan.deferred == [0] and plan.leaving == [] and plan.lost == [4]
    assert 0 in plan.members and plan.transfers == []
    assert any(row[0] == 0 for row in plan.slots)  # back in a stage-0 slot
    # Node 3 died instead, after node 4 got all of stage 0: node 0 is not needed and just leaves.
    got = {"committed": 6, "versions": {"0": 6, "1": 6, "2": 6}, "leaving": False}
    plan = make_plan(
        config,
        generation=4,
        previous=handover,
        alive={0: holding, 1: stage1, 4: got},
        joiners=[],
        checkpoint_step=None,
        reason="hand-over failed",
    )
    assert plan.leaving == [0] and plan.deferred == [] and plan.transfers == []
    assert sorted(plan.members) == [1, 4]


def test_receiver_killed_mid_transfer_leaver_stays_and_hands_over_to_the_next_replacement() -> None:
    config = _config()
    # Replacement 4 dies after receiving one of the three layers; replacement 5 comes later.
    faults = [*SETUP, Fault(node=4, kind="kill", phase="transfer", at=1)]
    result = run_local(
        config, faults=faults, joins=[Join(node=4, after_step=5), Join(node=5, after_step=9)], timeout_s=80
    )
    assert result.exit_codes[4] == -9 and result.exit_codes[2] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (2, 4)), result.exit_codes
    _injected_in_transfer(result, 4)
    assert_same_math(result, config)
    # Node 0 was deferred again after the failed hand-over, and left only once node 5 took its state.
    generations = {e["generation"]: e for e in _events(result, "generation") if e["node"] == 0}
    again = [e for e in generations.values() if e["deferred"] == [0] and 4 in e["lost"]]
    assert again, f"node 0 was not kept after the receiver died: {generations}"
    assert [e["node"] for e in _events(result, "left")] == [0]
    assert _steps(result, 5)[-1] == config.steps - 1
    assert set(_steps(result, 1)) == set(range(config.steps))
    assert not _events(result, "job_failed")
    _assert_no_timeout(result)


def test_receiver_killed_after_the_last_message_leaver_trains_to_the_end() -> None:
    # The sends all completed, but the receiving generation never committed a step: node 0 had not
    # left yet (it waits for that first commit), so it still holds stage 0 and trains on, deferred.
    config = _config()
    faults = [*SETUP, Fault(node=4, kind="kill", phase="transfer", at=len(STAGE0))]
    result = run_local(config, faults=faults, joins=[Join(node=4, after_step=5)], timeout_s=80)
    assert result.exit_codes[4] == -9 and result.exit_codes[2] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (2, 4)), result.exit_codes
    _injected_in_transfer(result, 4)
    assert_same_math(result, config)
    assert not _events(result, "left")  # no replacement left to take the state: it stayed
    assert set(_steps(result, 0)) == set(range(config.steps))
    assert not _events(result, "job_failed")
    _assert_no_timeout(result)


def test_third_node_killed_during_the_handover_keeps_the_math() -> None:
    # Node 3 (stage 1, not in the hand-over) dies while 0 sends stage 0 to 4. The generation is
    # given up; in the next one node 4 already holds stage 0 at the right step, so node 0 leaves
    # without sending again, and nodes 4 and 1 train on as one pipeline.
    config = _config()
    result = _kill_in_transfer(config, node=3, at=0)
    assert result.exit_codes[3] == -9 and result.exit_codes[2] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (2, 3)), result.exit_codes
    _injected_in_transfer(result, 3)
    assert_same_math(result, config)
    assert [e["node"] for e in _events(result, "left")] == [0]
    assert _steps(result, 4)[-1] == config.steps - 1
    assert set(_steps(result, 1)) == set(range(config.steps))
    assert not _events(result, "job_failed")
    _assert_no_timeout(result)


def test_leaver_killed_mid_transfer_fails_the_job_naming_the_lost_layer() -> None:
    config = _config()
    result = _kill_in_transfer(config, node=0, at=1)
    assert result.exit_codes[0] == -9 and result.exit_codes[2] == -9
    _injected_in_transfer(result, 0)
    # Everyone left exits with the reason: no hang, no false "done", the replacement included.
    assert all(result.exit_codes[n] not in (0, None) for n in (1, 3, 4)), result.exit_codes
    failures = _events(result, "job_failed")
    assert sorted(e["node"] for e in failures) == [1, 3, 4]
    # The first layer missing: 0 if its message had not got out before the kill, else 1.
    lost = {f"layer {layer} has no surviving copy" for layer in STAGE0[:2]}
    assert all(any(text in e["reason"] for text in lost) for e in failures), failures
    assert not _events(result, "done")
    _assert_no_timeout(result)


def test_source_killed_mid_transfer_another_holder_sends_instead() -> None:
    # DP=3 x PP=2, 6 layers: node 1 (stage 1 of pipeline 0) dies; replacement 6 fetches stage 1
    # from node 3, which is killed in the middle of it. Node 5 still holds stage 1: the next plan
    # takes it from there and the job trains on.
    config = dp3_config()
    stage1 = initial_layout(config).layers_of(1)
    assert len(stage1) >= 2, "the transfer must have a middle"
    faults = [Fault(node=1, kind="kill", step=1), Fault(node=3, kind="kill", phase="transfer", at=-1)]
    result = run_local(config, faults=faults, joins=[Join(node=6, after_step=2)], timeout_s=80)
    assert result.exit_codes[1] == -9 and result.exit_codes[3] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (1, 3)), result.exit_codes
    _injected_in_transfer(result, 3)
    assert_same_math(result, config)
    assert _steps(result, 6)[-1] == config.steps - 1
    assert not _events(result, "job_failed")
    _assert_no_timeout(result)
