"""Strategy reactions on the slots grid: the control plane asks the runtime's strategies."""

from __future__ import annotations

from controlplane.orchestration import reactions
from runtime.config import JobConfig, ModelSpec, resolve_strategy


def config(strategy: str, *, dp: int = 2, pp: int = 2, **fields) -> JobConfig:
    return JobConfig(model=ModelSpec(kind="mlp", n_layer=4), dp=dp, pp=pp, microbatches=2, global_batch=8,
                     strategy=resolve_strategy(strategy), **fields)


def test_each_strategy_names_its_reaction():
    slots = reactions.full_slots([11, 12, 13, 14], dp=2, pp=2)
    assert slots == [[11, 12], [13, 14]]
    for strategy, decision in [("recycle", "reroute"), ("auto", "reroute"), ("bamboo", "takeover"),
                               ("oobleck", "reinstantiate"), ("checkpoint", "restart")]:
        reaction = reactions.react_leave(config(strategy), slots, {12})
        assert reaction.decision == decision
        assert reaction.slots == [[11, None], [13, 14]]


def test_infeasible_leaves_wait_for_replacements_or_fail_when_the_state_is_lost():
    slots = [[11, 12], [13, 14]]
    no_spill = config("recycle", recycle_spill=False)
    assert reactions.react_leave(no_spill, slots, {12, 14}).decision == "fail"  # stage 1's layers are gone
    # With a notice the leaving nodes are still here: the runtime keeps one until a replacement joins.
    kept = reactions.react_leave(no_spill, slots, {12, 14}, noticed={12, 14})
    assert kept.decision == "reroute" and sum(n in (12, 14) for n in reactions.alive(kept.slots)) == 1
    assert reactions.react_leave(config("checkpoint"), slots, {11, 12, 13}).decision == "wait"  # not one pipeline
    assert reactions.react_leave(config("oobleck", min_stages=2), slots, {11, 12, 13}).decision == "fail"
    assert reactions.react_leave(config("oobleck"), slots, {11, 12, 13}).decision == "fail"  # layers lost
    assert reactions.react_leave(config("oobleck"), slots, {11, 12}).decision == "reinstantiate"


def test_bamboo_goes_on_when_a_stage_and_its_replica_holder_are_both_lost():
    # The control plane once had its own rule and waited here; the runtime hands the lost
    # pipeline's micro-batches to the other pipeline, so the job goes on.
    reaction = reactions.react_leave(config("bamboo"), [[11, 12], [13, 14]], {11, 12})
    assert reaction.decision == "takeover" and reaction.slots == [[None, None], [13, 14]]


def test_join_fills_first_hole_first_and_membership_ranks():
    reaction = reactions.react_join(config("recycle"), [[11, None], [None, 14]], [21, 22, 23])
    assert reaction.slots == [[11, 21], [22, 14]]
    nodes = reactions.assign_nodes(reaction.slots, {11: 0, 12: 1, 13: 2, 14: 3})
    assert reactions.membership_of(reaction.slots, nodes) == [
        {"instance": 11, "rank": 0, "pipeline": 0, "stage": 0, "node": 0},
        {"instance": 21, "rank": 1, "pipeline": 0, "stage": 1, "node": 4},
        {"instance": 22, "rank": 2, "pipeline": 1, "stage": 0, "node": 5},
        {"instance": 14, "rank": 3, "pipeline": 1, "stage": 1, "node": 3},
    ]


def test_first_generation_numbers_nodes_like_the_runtime():
    slots = reactions.full_slots([7, 9, 4, 5], dp=2, pp=2)
    assert reactions.assign_nodes(slots, None) == {7: 0, 9: 1, 4: 2, 5: 3}


def test_a_lost_stage_restarts_from_the_newest_checkpoint_when_the_job_has_one():
    """Every holder of stage 1 gone (a zone-wide reclaim): without a checkpoint the job fails, with
    one recycle, bamboo and oobleck restart from it on the survivors, as their workers would."""
    slots = [[11, 12], [13, 14]]
    for strategy in ("recycle", "oobleck"):
        assert reactions.react_leave(config(strategy), slots, {12, 14}).decision == "fail"
        restart = reactions.react_leave(config(strategy), slots, {12, 14}, checkpoint_step=6)
        assert restart.decision == "restart", strategy
        assert "restored from checkpoint step 6" in restart.reason
        assert set(reactions.alive(restart.slots)) == {11, 13}
    # bamboo loses a stage and its replica holder only when the whole ring is gone (pp=3, dp=1).
    ring = [[11, 12, 13]]
    assert reactions.react_leave(config("bamboo", dp=1, pp=3), ring, {12, 13}).decision == "fail"
    assert reactions.react_leave(config("bamboo", dp=1, pp=3), ring, {12, 13}, checkpoint_step=4).decision == "restart"
    # Nobody left at all: with a checkpoint the job waits for replacements instead of failing.
    assert reactions.react_leave(config("recycle"), slots, {11, 12, 13, 14}).decision == "fail"
    assert reactions.react_leave(config("recycle"), slots, {11, 12, 13, 14}, checkpoint_step=6).decision == "wait"
    # `none` keeps no fallback: it writes checkpoints but fails as before.
    assert reactions.react_leave(config("none"), slots, {12, 14}, checkpoint_step=6).decision == "fail"
