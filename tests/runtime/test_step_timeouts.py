"""Hang detection that scales with the step time (docs/runtime.md "Timeouts").

Every blocking call of a training step is bounded by `JobConfig.step_timeout`: max(op_timeout_s,
op_timeout_factor x the step time expected from the slowest step measured so far), or, before any
measurement, `first_step_timeout`. A wait bounded by more than `heartbeat_timeout_s` also ends as soon
as the awaited peer's heartbeat is stale, so a hung peer is found within about the heartbeat timeout
however long the bound is; a killed peer fails every call at once (closed connection), as before.
"""

from __future__ import annotations

import itertools
import math

import pytest

from runtime.config import JobConfig, LayoutError
from runtime.train.launcher import Fault, RunResult, run_local
from tests.runtime.conftest import assert_same_math, small_config


def _events(result: RunResult, name: str) -> list[dict]:
    return [r for r in result.records if r.get("event") == name]


# -- the rule (no processes) -------------------------------------------------------------------------


def test_step_timeout_is_the_floor_or_a_factor_of_the_expected_step() -> None:
    cfg = JobConfig(op_timeout_s=1.5, op_timeout_factor=3.0)
    assert cfg.step_timeout(0.05, first_s=0.0) == 1.5  # a tiny model's step: the floor, as before
    assert cfg.step_timeout(0.5, first_s=0.0) == 1.5
    assert cfg.step_timeout(61.0, first_s=0.0) == pytest.approx(183.0)  # GPT-2 on 2 CPU cores
    assert cfg.step_timeout(None, first_s=700.0) == 700.0  # nothing measured yet: the first-step bound
    assert cfg.step_timeout(None, first_s=0.2) == 1.5  # never under the floor


def test_first_step_timeout_is_set_or_derived_from_the_work() -> None:
    derived = JobConfig(op_timeout_s=1.5, compute_floor_gflop_s=1.0)
    assert derived.first_step_timeout(2.4e5) == pytest.approx(1.5, abs=1e-3)  # a tiny MLP: about the floor
    gpt2 = 6 * 163e6 * 1024  # 6 x parameters (untied) x tokens of one sample
    assert derived.first_step_timeout(gpt2) == pytest.approx(1.5 + gpt2 / 1e9)  # about 1,000 s
    assert derived.first_step_timeout(gpt2) > 61.0 * 3  # far above the step measured on this CPU
    fixed = JobConfig(op_timeout_s=1.5, first_step_timeout_s=30.0)
    assert fixed.first_step_timeout(0.0) == fixed.first_step_timeout(gpt2) == 30.0


def test_step_timeout_settings_are_validated_naming_the_value() -> None:
    for bad in (0.5, 0.0, -1.0, math.nan, math.inf):
        with pytest.raises(LayoutError, match=f"op_timeout_factor={bad}"):
            JobConfig(op_timeout_factor=bad).validate()
    for bad in (-1.0, 0.5, math.nan, math.inf):  # 0.5 is below op_timeout_s
        with pytest.raises(LayoutError, match=f"first_step_timeout_s={bad}"):
            JobConfig(op_timeout_s=1.0, first_step_timeout_s=bad).validate()
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(LayoutError, match=f"compute_floor_gflop_s={bad}"):
            JobConfig(compute_floor_gflop_s=bad).validate()
    JobConfig(op_timeout_s=1.0, op_timeout_factor=1.0, first_step_timeout_s=1.0).validate()
    assert JobConfig.from_dict(JobConfig(op_timeout_factor=4.0).to_dict()).op_timeout_factor == 4.0


# -- real processes ------------------------------------------------------------------------------------

DELAY_S = 3.0
"""A stage's extra work per step: 3 x op_timeout_s (1 s) of the tests below."""


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_slow_stage_every_step_is_not_mistaken_for_a_failure() -> None:
    # Node 1 (stage 1 of pipeline 0) takes DELAY_S more in every step, so its peers wait about that
    # long for its messages, 3x op_timeout_s. With one bound of op_timeout_s (the old rule) the job
    # regrouped in step 0 and in every step after; now step 0 is bounded by first_step_timeout_s
    # (nothing measured yet) and every later step by 3x the slowest step measured before it.
    config = small_config(strategy="recycle", schedule="fiw", steps=4, op_timeout_s=1.0, heartbeat_timeout_s=3.0,
                          first_step_timeout_s=20.0)
    faults = [Fault(node=1, kind="delay", step=s, delay_s=DELAY_S) for s in range(config.steps)]
    result = run_local(config, faults=faults, timeout_s=110)
    assert all(code == 0 for code in result.exit_codes.values()), result.exit_codes
    assert not _events(result, "failure_detected"), _events(result, "failure_detected")
    assert {e["generation"] for e in _events(result, "generation")} == {0}  # never regrouped
    assert_same_math(result, config)
    steps = [r for r in result.steps() if r["node"] == 0]
    assert [r["step"] for r in steps] == list(range(config.steps))
    assert all(r["step_time_s"] > DELAY_S for r in steps)
    assert steps[0]["op_timeout_s"] == 20.0  # the first step's bound
    for before, after in itertools.pairwise(steps):  # then 3x the slowest step so far
        assert after["op_timeout_s"] >= 3.0 * before["step_time_s"] * 0.999


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_hung_node_under_a_long_bound_is_found_by_its_heartbeat() -> None:
    # Every call of step 0 may wait 60 s (first_step_timeout_s), yet a node hung (SIGSTOP) in it is
    # given up within about heartbeat_timeout_s (3 s) + a watch poll: the survivors' waits watch the
    # awaited peer's heartbeat. The job goes on without it and keeps the failure-free math.
    config = small_config(strategy="recycle", schedule="fiw", op_timeout_s=1.0, heartbeat_timeout_s=3.0,
                          first_step_timeout_s=60.0)
    result = run_local(config, faults=[Fault(node=3, kind="stop", step=0)], timeout_s=110)
    assert result.exit_codes[3] is None  # still stopped when the job ended (then killed by the launcher)
    assert_same_math(result, config)
    stopped = [e for e in _events(result, "inject_stop") if e["node"] == 3]
    detected = [e for e in _events(result, "failure_detected") if e["generation"] == 0]
    assert stopped and detected
    assert any("no heartbeat" in e["reason"] for e in detected), detected
    # Within heartbeat_timeout_s + slack for a loaded machine; far under the 60 s bound.
    first = min(e["time"] for e in detected)
    assert first - stopped[0]["time"] < 3.0 + 7.0, first - stopped[0]["time"]
