"""Same math under failure: real processes on gloo lose nodes mid-run and still end with the
parameters of the failure-free single-process run (default float32 tolerances)."""

from __future__ import annotations

from collections import Counter

import pytest

from runtime.checkpointing.checkpoints import Checkpoints
from runtime.config import DeviceTime, ModelSpec
from runtime.strategies import get_strategy
from runtime.train.launcher import Fault, Join, RunResult, faults_from_trace, run_local
from tests.runtime.conftest import assert_same_math, small_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(90)]


def events(result: RunResult, name: str) -> list[dict]:
    return [r for r in result.records if r.get("event") == name]


def committed_steps(result: RunResult, node: int) -> list[int]:
    return [r["step"] for r in result.steps() if r["node"] == node]


@pytest.mark.parametrize("strategy", ["recycle", "bamboo", "oobleck"])
def test_killed_node_mid_step_same_math(strategy: str) -> None:
    config = small_config(strategy=strategy, schedule="fiw" if strategy == "recycle" else "1f1b")
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=1)], timeout_s=80)
    assert result.exit_codes[1] == -9
    assert all(code == 0 for node, code in result.exit_codes.items() if node != 1), result.exit_codes
    assert_same_math(result, config)
    generations = [e for e in events(result, "generation") if e["generation"] == 1]
    assert generations and all(e["lost"] == [1] for e in generations)
    assert all(e["start_step"] == 1 for e in generations)  # continued from the current step, no restart
    assert events(result, "failure_detected")


def _spill_config(*, steps: int):
    """DP=2 x PP=2 recycle with spill, 6 layers and 3 micro-batches of 2 pipelines' share."""
    return small_config(strategy="recycle", schedule="fiw", recycle_spill=True, model=ModelSpec(n_layer=6),
                        microbatches=3, global_batch=12, steps=steps)


def test_recycle_spill_to_another_stage_node_keeps_the_math() -> None:
    # When node 1 (stage 1) dies, spill puts one of its micro-batches on node 2 (stage 0 of the
    # other pipeline), which fetches stage 1's layers from node 3 and runs them for pipeline 0.
    config = _spill_config(steps=5)
    degraded = get_strategy("recycle").layout_for(config, [[0, None], [2, 3]])
    assert {route[1][1] for route in degraded.routes} == {2, 3}
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=2)], timeout_s=80)
    assert result.exit_codes[1] == -9
    assert_same_math(result, config)
    assert set(committed_steps(result, 0)) == set(range(config.steps))


def test_recycle_spill_kill_then_notice_moves_layers_twice_and_keeps_the_math() -> None:
    # Generation 1 (node 1 killed): node 2 also hosts stage 1 for one micro-batch. Generation 2
    # (node 2 leaves on notice): node 0 fetches stage 1 and hosts it for one micro-batch, node 3
    # fetches stage 0 and hosts it for two.
    config = _spill_config(steps=6)
    recycle = get_strategy("recycle")
    assert [n for _, n in recycle.layout_for(config, [[0, None], [2, 3]]).routes[0]] == [0, 2]
    after = recycle.layout_for(config, [[0, None], [None, 3]])
    assert [n for _, n in after.routes[2]] == [0, 0] and [n for _, n in after.routes[3]] == [3, 3]
    faults = [Fault(node=1, kind="kill", step=1), Fault(node=2, kind="notice", step=3)]
    result = run_local(config, faults=faults, timeout_s=80)
    assert result.exit_codes[1] == -9 and result.exit_codes[2] == 0
    assert_same_math(result, config)
    assert set(committed_steps(result, 0)) == set(range(config.steps))


def test_trace_driven_kills_and_join_keep_the_math(shared_data) -> None:
    # Bamboo's p3 trace on 4 nodes: node 2 is taken at once, a replacement arrives 0.54 trace-s
    # later and fills its slot, node 0 is taken at 1.02 trace-s (run 4x slower than the trace, so
    # the replacement is in before the second kill even on a loaded machine). Spill re-routes each lost stage-0 hop.
    faults, joins = faults_from_trace(
        shared_data / "traces" / "aws-p3.2xlarge-bamboo.csv", nodes=4, time_scale=4e-3, limit=2
    )
    assert [(f.node, f.time_s) for f in faults] == [(2, 0.0), (0, pytest.approx(4.08))]
    assert (joins[0].node, joins[0].time_s) == (4, pytest.approx(2.16))
    config = small_config(
        strategy="recycle", schedule="fiw", recycle_spill=True, steps=120, device_time=DeviceTime(forward_ms=4.0)
    )
    result = run_local(config, faults=faults, joins=joins[:1], timeout_s=80)
    assert result.exit_codes[2] == -9 and result.exit_codes[0] == -9
    assert_same_math(result, config)
    generations = [e for e in events(result, "generation") if e["node"] == 4]
    assert generations and 4 in generations[0]["members"]
    assert committed_steps(result, 4)[-1] == config.steps - 1  # the replacement finished with the others
    assert {e["generation"] for e in events(result, "generation")} >= {0, 1, 2, 3}  # kill, join, kill


@pytest.mark.parametrize("second", ["notice", "kill"])
def test_recycle_spill_survives_losing_every_slot_holder_of_a_stage(second: str) -> None:
    # Spill is recycle's default. Node 2 (stage 0 of pipeline 1) dies: spill hosts some of pipeline
    # 1's stage-0 hops on stage-1 nodes, which fetch stage 0's layers. Then node 0, stage 0's last
    # slot holder, goes too (a notice, or a kill): the spill hosts hold copies, so the job trains on
    # without waiting for a replacement (as published, recycle would have to stop or defer).
    config = small_config(strategy="recycle", schedule="fiw", steps=8, device_time=DeviceTime(forward_ms=4.0))
    degraded = get_strategy("recycle").layout_for(config, [[0, 1], [None, 3]])
    assert {route[0][1] for route in degraded.routes} - {0}, "spill puts some stage-0 hops off node 0"
    faults = [Fault(node=2, kind="kill", step=1), Fault(node=0, kind=second, step=4)]
    result = run_local(config, faults=faults, timeout_s=80)
    assert result.exit_codes[2] == -9 and result.exit_codes[0] == (0 if second == "notice" else -9)
    assert result.exit_codes[1] == 0 and result.exit_codes[3] == 0, result.exit_codes
    assert_same_math(result, config)
    assert set(committed_steps(result, 1)) == set(range(config.steps))
    assert not events(result, "job_failed")


@pytest.mark.parametrize("strategy", ["recycle", "bamboo", "oobleck"])
def test_notice_leaves_cleanly_with_zero_steps_lost(strategy: str) -> None:
    config = small_config(strategy=strategy)
    result = run_local(config, faults=[Fault(node=1, kind="notice", step=1)], timeout_s=80)
    assert all(code == 0 for code in result.exit_codes.values()), result.exit_codes
    assert_same_math(result, config)
    assert not events(result, "failure_detected")
    assert [e["node"] for e in events(result, "left")] == [1]
    assert committed_steps(result, 1) == [0, 1]  # it finished the step it got the notice in
    assert committed_steps(result, 0) == list(range(config.steps))  # nothing redone: zero steps lost


@pytest.mark.parametrize("second", ["notice", "kill"])
@pytest.mark.parametrize("strategy", ["recycle", "bamboo", "oobleck"])
def test_two_nodes_lost(strategy: str, second: str) -> None:
    config = small_config(strategy=strategy, steps=5)
    faults = [Fault(node=1, kind="kill", step=1), Fault(node=2, kind=second, step=2)]
    result = run_local(config, faults=faults, timeout_s=80)
    assert result.exit_codes[1] == -9
    assert result.exit_codes[2] == (0 if second == "notice" else -9)
    assert_same_math(result, config)
    assert set(committed_steps(result, 0)) == set(range(config.steps))


def test_hung_node_is_detected_by_timeout_and_fenced() -> None:
    config = small_config(strategy="recycle", schedule="fiw", op_timeout_s=1.5, heartbeat_timeout_s=3.0)
    result = run_local(config, faults=[Fault(node=3, kind="stop", step=1)], timeout_s=80)
    assert result.exit_codes[3] is None  # still stopped when the job ended (then killed by the launcher)
    assert_same_math(result, config)
    assert any("Timed out" in e["reason"] for e in events(result, "failure_detected"))


def test_replacement_joins_and_job_grows_back() -> None:
    # Emulated device time keeps steps long enough (~0.1 s) for the replacement to arrive mid-run.
    config = small_config(strategy="recycle", schedule="fiw", steps=12, device_time=DeviceTime(forward_ms=4.0))
    result = run_local(
        config, faults=[Fault(node=1, kind="kill", step=1)], joins=[Join(node=4, after_step=2)], timeout_s=80
    )
    assert_same_math(result, config)
    joined = [e for e in events(result, "generation") if e["node"] == 4]
    assert joined and 4 in joined[0]["members"] and len(joined[0]["members"]) == 4
    assert committed_steps(result, 4)[-1] == config.steps - 1  # commits together with the others


def test_checkpoint_restarts_from_last_checkpoint(tmp_path) -> None:
    config = small_config(strategy="checkpoint", steps=5, checkpoint_interval=2, checkpoint_dir=str(tmp_path))
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=3)], timeout_s=80)
    assert_same_math(result, config)  # replaying from the checkpoint is deterministic
    restarts = [e for e in events(result, "generation") if e["generation"] == 1]
    assert restarts and all(e["start_step"] == 2 for e in restarts)  # checkpoint of step 2
    redone = Counter(committed_steps(result, 0))
    assert redone[2] == 2  # step 2 was computed twice: the steps since the checkpoint are lost
    assert (tmp_path / "checkpoints" / "step-2" / "model.safetensors.index.json").exists()  # an export: two writers


def test_checkpoint_on_notice_saves_at_the_boundary_and_loses_nothing(tmp_path) -> None:
    config = small_config(strategy="checkpoint", steps=5, checkpoint_interval=100, checkpoint_dir=str(tmp_path))
    result = run_local(config, faults=[Fault(node=1, kind="notice", step=2)], timeout_s=80)
    assert all(code == 0 for code in result.exit_codes.values()), result.exit_codes
    assert_same_math(result, config)
    assert (tmp_path / "checkpoints" / "step-3" / "model.safetensors.index.json").exists()  # at the boundary
    assert Counter(committed_steps(result, 0)) == Counter(range(config.steps))  # nothing replayed
    # Generations that ended cleanly (the notice's, the last) leave no gloo group parked behind.
    closed = events(result, "groups_closed")
    assert closed and all(e["parked"] == 0 for e in closed), closed


@pytest.mark.parametrize(
    ("strategy", "dp", "pp", "killed", "restores"),
    [
        # dp=2 x pp=2: nodes 1 and 3 hold stage 1 of both pipelines; recycle and oobleck have no
        # other copy of it, bamboo's replicas (on nodes 0 and 2) keep it going without a restart.
        ("recycle", 2, 2, {1: 3, 3: 3}, True),
        ("oobleck", 2, 2, {1: 3, 3: 3}, True),
        ("bamboo", 2, 2, {1: 3, 3: 3}, False),
        # dp=1 x pp=3: nodes 1 (stage 1) and 0 (its bamboo replica) are every holder of stage 1.
        # Node 0 dies a step later: were it first, node 1 (still writing its share of the checkpoint)
        # could join the next generation and hand node 2 a replica of stage 1 before dying itself,
        # and nothing would be lost. Node 1 first always loses stage 1 with node 0 (its takeover).
        ("bamboo", 1, 3, {1: 3, 0: 4}, True),
    ],
)
def test_losing_every_holder_of_a_stage_falls_back_to_the_checkpoint(
    strategy: str, dp: int, pp: int, killed: dict[int, int], restores: bool, tmp_path
) -> None:
    # The holders die (a zone-wide reclaim) from the start of step 3, after the checkpoint of step 2;
    # the job restarts from it, replays step 2 and ends with the failure-free math.
    config = small_config(strategy=strategy, dp=dp, pp=pp, global_batch=4 * dp, steps=5, checkpoint_interval=2)
    result = run_local(config, faults=[Fault(node=n, kind="kill", step=step, at=0) for n, step in killed.items()],
                       export_dir=tmp_path, timeout_s=80)
    survivors = [n for n in range(config.num_nodes) if n not in killed]
    assert all(result.exit_codes[n] == 0 for n in survivors), result.exit_codes
    assert_same_math(result, config)
    assert 2 in Checkpoints(str(tmp_path)).complete_steps()  # the one written before the kill
    restored = [e for e in events(result, "generation") if "restored from checkpoint step 2" in e["reason"]]
    replays = Counter(committed_steps(result, survivors[0]))[2]
    if restores:
        reasons = [e["reason"] for e in events(result, "generation")]
        assert sorted(e["node"] for e in restored) == survivors, reasons
        assert all(e["start_step"] == 2 for e in restored), reasons
        assert replays == 2  # step 2 redone from the checkpoint
    else:
        assert not restored and replays == 1


def test_losing_a_stage_without_a_checkpoint_fails_naming_the_missing_checkpoint() -> None:
    config = small_config(strategy="recycle", steps=4)  # Young/Daly from the priors: no checkpoint in 4 steps
    result = run_local(config, faults=[Fault(node=n, kind="kill", step=2) for n in (1, 3)], timeout_s=80)
    failures = events(result, "job_failed")
    assert sorted(e["node"] for e in failures) == [0, 2]
    assert all("no checkpoint was available to restart from" in e["reason"] for e in failures), failures


def test_a_stop_request_checkpoints_one_step_on_every_member_and_a_restart_keeps_the_math(tmp_path) -> None:
    """A limit of the control plane stops the job (`Coordinator.request_stop`): the first member
    puts it in the step's commit, so every member stops after the same step, the writers checkpoint
    it, every worker exits 0, and a run started from that checkpoint ends with the failure-free math."""
    config = small_config(strategy="recycle", steps=12, checkpoint_interval=100, checkpoint_dir=str(tmp_path))
    first = run_local(config, stop_after_step=3, timeout_s=80)
    assert all(code == 0 for code in first.exit_codes.values()), first.exit_codes
    stopped = events(first, "stopped")
    assert len(stopped) == config.num_nodes and len({e["committed"] for e in stopped}) == 1, stopped
    step = stopped[0]["committed"]
    assert 3 <= step < config.steps
    folder = tmp_path / "checkpoints" / f"step-{step}"
    assert (folder / "model.safetensors.index.json").exists()  # complete: every writer wrote its share
    assert Checkpoints(str(tmp_path)).latest() == step
    rest = run_local(small_config(strategy="recycle", steps=12, init_from=str(folder)), timeout_s=80)
    assert_same_math(rest, config)
