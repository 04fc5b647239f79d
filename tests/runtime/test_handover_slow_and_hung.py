"""A state hand-over that is slow (longer than `op_timeout_s`) or whose peer hangs (SIGSTOP) in the
middle of it (real processes on gloo; the settings of tests/runtime/test_handover_faults.py).

- A hand-over's calls are bounded by `JobConfig.transfer_timeout_s`, not by the short step bound
  `op_timeout_s`: a message that takes longer than `op_timeout_s` (a slow link, emulated by the
  sender or the receiver sleeping before it) still completes, and the job is bit-identical.
- A receiver hung mid-transfer: the leaver stops waiting for it (its sends time out, or, with a
  long transfer bound, its waits see the receiver's stale heartbeat first), the others see the
  abort or the stale heartbeat, the next generation forms without the hung node, the leaver is
  deferred again and hands over to the next replacement. Same math.
- A source hung mid-transfer while another node holds the same stage (DP=3 join): the receiver
  stops waiting in the same ways, the next plan takes the layers from the other holder. Same math.
Each runs with the derived transfer bound (about op_timeout_s here) and with a long one, which a
hung peer must not make anybody wait for; neither waits for the rendezvous timeout, and the hung
process is gone when the run returns.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runtime.config import JobConfig, LayoutError
from runtime.strategies import initial_layout
from runtime.train.launcher import Fault, Join, RunResult, run_local
from tests.runtime.conftest import assert_same_math, small_config
from tests.runtime.test_handover_faults import SETUP, _config, _events, _steps, dp3_config

# Waits that end only at the rendezvous timeout raise with these words (runtime/distributed/coordinator.py).
RENDEZVOUS_TIMEOUTS = ("did not form within", "not ready within", "was not taken within")


def test_transfer_timeout_is_validated_naming_the_value() -> None:
    for bad in (-1.0, math.nan, math.inf, 0.5):  # 0.5 is below op_timeout_s
        with pytest.raises(LayoutError, match=f"transfer_timeout_s={bad}"):
            JobConfig(op_timeout_s=1.0, transfer_timeout_s=bad).validate()
    for bad in (0.0, -5.0, math.nan):
        with pytest.raises(LayoutError, match=f"transfer_floor_mb_s={bad}"):
            JobConfig(transfer_floor_mb_s=bad).validate()
    with pytest.raises(LayoutError, match="op_timeout_s=0"):
        JobConfig(op_timeout_s=0).validate()
    JobConfig(op_timeout_s=1.0, transfer_timeout_s=1.0).validate()  # equal to the op bound is fine


def test_transfer_timeout_is_the_set_value_or_grows_with_the_bytes_moved() -> None:
    derived = JobConfig(op_timeout_s=1.0, transfer_floor_mb_s=50.0)
    assert derived.transfer_timeout(0) == derived.op_timeout_s  # a tiny hand-over: the op bound
    big = 738 * 10**6  # one GPT-2 XL block (30.7M parameters) with its AdamW moments, in float64
    assert derived.transfer_timeout(big) == derived.op_timeout_s + big / (derived.transfer_floor_mb_s * 1e6)
    assert derived.transfer_timeout(2 * big) > derived.transfer_timeout(big)
    fixed = JobConfig(op_timeout_s=1.0, transfer_timeout_s=30.0)
    assert fixed.transfer_timeout(0) == fixed.transfer_timeout(big) == fixed.transfer_timeout_s


def test_launcher_rejects_an_unknown_fault_kind() -> None:
    # A worker skips kinds it does not know: a misspelt kind must not quietly inject nothing.
    with pytest.raises(ValueError, match="'hang' is unknown"):
        run_local(small_config(), faults=[Fault(node=0, kind="hang", phase="transfer")])
    with pytest.raises(ValueError, match="delay_s > 0"):
        run_local(small_config(), faults=[Fault(node=0, kind="delay", phase="transfer")])


def _assert_no_rendezvous_timeout(result: RunResult) -> None:
    for event in _events(result, "failure_detected"):
        assert not any(text in event["reason"] for text in RENDEZVOUS_TIMEOUTS), event


def _assert_reaped(result: RunResult, node: int) -> None:
    """The hung node was still stopped when the job ended; run_local killed and reaped it."""
    assert result.exit_codes[node] is None, result.exit_codes
    assert not Path(f"/proc/{result.pids[node]}").exists(), f"node {node} (SIGSTOPped) outlived the run"


def _assert_hang_not_waited_out(result: RunResult, config: JobConfig, hung: int) -> None:
    """Nothing waited for the rendezvous timeout; with a long transfer bound nobody waited for it
    either: the hung peer was seen by its heartbeat (or an abort), not by a timed-out call."""
    _assert_no_rendezvous_timeout(result)
    recovery = _recovery_s(result, hung)
    print(f"node {hung} hung -> next generation without it: {recovery:.2f} s")
    assert recovery < config.rendezvous_timeout_s
    if config.transfer_timeout_s > 0:
        for event in _events(result, "failure_detected"):
            assert "Timed out" not in event["reason"], event
        assert recovery < config.transfer_timeout_s


def _recovery_s(result: RunResult, node: int) -> float:
    """Seconds from `node` stopping itself to the first generation formed without it."""
    stopped = next(e["time"] for e in _events(result, "inject_stop") if e["node"] == node)
    later = [e for e in _events(result, "generation") if e["time"] > stopped and node not in e["members"]]
    assert later, "no generation formed without the hung node"
    return later[0]["time"] - stopped


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize("slow", [0, 4], ids=["sender-slow", "receiver-slow"])
def test_handover_slower_than_the_op_timeout_completes(slow: int) -> None:
    # The deferred hand-over of test_handover_faults (node 0 sends stage 0 to replacement 4); one
    # node sleeps 1.5 x op_timeout_s before its second message, so a call of each side waits that long.
    config = _config()
    config.transfer_timeout_s = 3 * config.op_timeout_s
    delay = 1.5 * config.op_timeout_s
    faults = [*SETUP, Fault(node=slow, kind="delay", phase="transfer", at=1, delay_s=delay)]
    result = run_local(config, faults=faults, joins=[Join(node=4, after_step=5)], timeout_s=100)
    assert result.exit_codes[2] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node != 2), result.exit_codes
    assert [e["phase"] for e in _events(result, "inject_delay")] == ["transfer"]
    transfers = {e["node"]: e for e in _events(result, "transfer")}
    assert sorted(transfers) == [0, 4], transfers  # one hand-over, done once
    for event in transfers.values():
        print(f"node {slow} slow: node {event['node']} transfer {event['seconds']:.2f} s")
        assert event["timeout_s"] == config.transfer_timeout_s
        assert event["seconds"] > config.op_timeout_s, event  # the old bound would have failed it
    assert_same_math(result, config)
    assert [e["node"] for e in _events(result, "left")] == [0]
    assert _steps(result, 4)[-1] == config.steps - 1
    # The only failure is node 2's kill, before the hand-over.
    assert [e["generation"] for e in _events(result, "failure_detected")] == [0] * 3
    assert not _events(result, "job_failed")


def _story(generations: list[dict]) -> str:
    """Node 0's generations, one line each, whole: what a failed expectation about them needs."""
    keys = ("generation", "start_step", "members", "lost", "leaving", "deferred", "joined", "reason")
    return "\n".join(str({k: e.get(k) for k in keys}) for e in generations)


# 0: derived (about op_timeout_s for these tiny layers, below heartbeat_timeout_s); 20 s: a bound
# sized for big layers, five times the heartbeat timeout.
TRANSFER_BOUNDS = pytest.mark.parametrize("transfer_timeout_s", [0.0, 20.0], ids=["derived", "long"])


@pytest.mark.runtime
@pytest.mark.timeout(120)
@TRANSFER_BOUNDS
def test_receiver_hung_mid_transfer_leaver_stays_and_hands_over_to_the_next_replacement(
    transfer_timeout_s: float,
) -> None:
    config = _config()
    config.transfer_timeout_s = transfer_timeout_s
    # Replacement 4 stops (SIGSTOP) after receiving one of the three layers; replacement 5 comes later.
    faults = [*SETUP, Fault(node=4, kind="stop", phase="transfer", at=1)]
    result = run_local(
        config, faults=faults, joins=[Join(node=4, after_step=5), Join(node=5, after_step=9)], timeout_s=100
    )
    _assert_reaped(result, 4)
    assert result.exit_codes[2] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (2, 4)), result.exit_codes
    assert [e["phase"] for e in _events(result, "inject_stop")] == ["transfer"]
    assert_same_math(result, config)
    generations = [e for e in _events(result, "generation") if e["node"] == 0]
    assert any(e["deferred"] == [0] and 4 in e["lost"] for e in generations), _story(generations)
    assert [e["node"] for e in _events(result, "left")] == [0]
    assert _steps(result, 5)[-1] == config.steps - 1
    assert set(_steps(result, 1)) == set(range(config.steps))
    assert not _events(result, "job_failed")
    _assert_hang_not_waited_out(result, config, 4)


@pytest.mark.runtime
@pytest.mark.timeout(120)
@TRANSFER_BOUNDS
def test_source_hung_mid_transfer_another_holder_sends_instead(transfer_timeout_s: float) -> None:
    # DP=3 x PP=2: node 1 (stage 1 of pipeline 0) dies; replacement 6 fetches stage 1 from node 3,
    # which stops in the middle of it. Node 5 still holds stage 1 and sends it in the next generation.
    config = dp3_config(transfer_timeout_s=transfer_timeout_s)
    assert len(initial_layout(config).layers_of(1)) >= 2, "the transfer must have a middle"
    faults = [Fault(node=1, kind="kill", step=1), Fault(node=3, kind="stop", phase="transfer", at=-1)]
    result = run_local(config, faults=faults, joins=[Join(node=6, after_step=2)], timeout_s=100)
    _assert_reaped(result, 3)
    assert result.exit_codes[1] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node not in (1, 3)), result.exit_codes
    assert [e["phase"] for e in _events(result, "inject_stop")] == ["transfer"]
    assert_same_math(result, config)
    assert _steps(result, 6)[-1] == config.steps - 1
    assert not _events(result, "job_failed")
    _assert_hang_not_waited_out(result, config, 3)
