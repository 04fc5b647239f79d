"""The control plane's reaction to lost nodes is the runtime's: for every strategy, over every set
of dead nodes of small grids, `reactions.react_leave` goes on exactly when the runtime's strategy
can lay the survivors out and every layer that layout needs still has a copy on a survivor (the
oracle below, written from those two rules, not from the code under test), waits for replacements
exactly when a strategy that restarts from its checkpoint cannot lay them out, and fails the job
otherwise. One decision, one owner: the control plane asks `runtime.distributed.membership.plan_for_fleet`."""

from __future__ import annotations

import itertools

import pytest

from controlplane.orchestration import reactions
from runtime.config import STRATEGIES, JobConfig, LayoutError, ModelSpec
from runtime.strategies import get_strategy

GRIDS = [(1, 2), (2, 2), (2, 3), (3, 2)]


def _oracle(config: JobConfig, full: reactions.Slots, dead: set[int]) -> str:
    strategy = get_strategy(config.strategy)
    held = strategy.layout_for(config, full)
    after = reactions.without(full, dead)
    survivors = set(reactions.alive(after))
    try:
        if not survivors:
            raise LayoutError("no survivor")
        layout = strategy.layout_for(config, after)
    except LayoutError:
        return "wait" if strategy.restarts_from_checkpoint else "fail"
    if strategy.restarts_from_checkpoint:
        return "go"
    copies = {layer for node in survivors for layer in held.layers_of(node)}
    needed = {layer for node in layout.nodes() for layer in layout.layers_of(node)}
    return "go" if needed <= copies else "fail"


# recycle_spill changes only recycle: recycle is checked with it on and off.
@pytest.mark.parametrize(("strategy", "spill"), [(s, True) for s in STRATEGIES] + [("recycle", False)])
def test_control_plane_and_runtime_agree_on_every_membership(strategy: str, spill: bool) -> None:
    outcomes = set()
    for dp, pp in GRIDS:
        for min_stages in sorted({1, pp}):
            config = JobConfig(model=ModelSpec(kind="mlp", n_layer=4), dp=dp, pp=pp, microbatches=2,
                               global_batch=4 * dp, strategy=strategy, recycle_spill=spill, min_stages=min_stages)
            full = reactions.full_slots(list(range(100, 100 + dp * pp)), dp=dp, pp=pp)
            nodes = reactions.alive(full)
            for lost in range(1, len(nodes) + 1):
                for dead in map(set, itertools.combinations(nodes, lost)):
                    reaction = reactions.react_leave(config, full, dead)
                    expected = _oracle(config, full, dead)
                    got = "go" if reaction.slots is not None else reaction.decision
                    assert got == expected, (dp, pp, min_stages, sorted(dead), reaction)
                    if got == "go":
                        assert reaction.slots == reactions.without(full, dead)
                    outcomes.add(got)
    # The grid reaches more than one outcome (`none` has no fault tolerance: every loss fails it).
    assert outcomes == {"fail"} if strategy == "none" else "go" in outcomes and len(outcomes) >= 2, outcomes
