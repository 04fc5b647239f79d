"""Strategy reactions on the slots grid (pure functions)."""

from __future__ import annotations

from controlplane.orchestration import reactions


def test_each_strategy_names_its_reaction():
    slots = reactions.full_slots([11, 12, 13, 14], dp=2, pp=2)
    assert slots == [[11, 12], [13, 14]]
    for strategy, decision in [("recycle", "reroute"), ("auto", "reroute"), ("bamboo", "takeover"),
                               ("oobleck", "reinstantiate"), ("checkpoint", "restart")]:
        reaction = reactions.react_leave(strategy, slots, {12})
        assert reaction.decision == decision
        assert reaction.slots == [[11, None], [13, 14]]


def test_infeasible_leaves_wait_for_replacements():
    slots = [[11, 12], [13, 14]]
    assert reactions.react_leave("recycle", slots, {12, 14}).decision == "wait"  # stage 1 gone
    assert reactions.react_leave("bamboo", slots, {11, 12}).decision == "wait"  # node and its replica holder
    assert reactions.react_leave("checkpoint", slots, {11, 12, 13}).decision == "wait"  # not one pipeline
    assert reactions.react_leave("oobleck", slots, {11, 12, 13}, min_stages=2).decision == "wait"
    assert reactions.react_leave("oobleck", slots, {11, 12, 13}, min_stages=1).decision == "reinstantiate"


def test_join_fills_first_hole_first_and_membership_ranks():
    reaction = reactions.react_join("recycle", [[11, None], [None, 14]], [21, 22, 23])
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
