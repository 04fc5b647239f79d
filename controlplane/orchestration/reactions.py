"""How a job's membership reacts when nodes leave or join, per strategy. Functions on the *slots*
grid the runtime uses (`runtime.strategies.base`): `slots[p][s]` is the instance filling stage s of
pipeline p of the full DP x PP layout, or None for a hole.

What happens to a membership is the runtime's answer, asked here (`runtime.distributed.membership.
plan_for_fleet`, which runs the runtime's own `make_plan` and the strategy's `layout_for`;
torch-free), so the control plane and the nodes never disagree on it. No torch here: the Celery
worker stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.config import JobConfig
from runtime.distributed.membership import plan_for_fleet
from runtime.strategies import get_strategy
from runtime.strategies.base import alive_nodes

Slots = list[list[int | None]]

@dataclass(frozen=True, slots=True)
class Reaction:
    """The outcome of a leave or a join: the decision's name and the next slots, or `slots=None`
    when the job cannot run until replacements arrive (decision `wait`)."""

    decision: str
    slots: Slots | None
    reason: str


def full_slots(instance_ids: list[int], *, dp: int, pp: int) -> Slots:
    """The failure-free grid: instances in order, pipeline-major."""
    if len(instance_ids) < dp * pp:
        raise ValueError(f"{len(instance_ids)} instances cannot fill dp={dp} x pp={pp}")
    return [[instance_ids[p * pp + s] for s in range(pp)] for p in range(dp)]


alive = alive_nodes


def holes(slots: Slots) -> list[tuple[int, int]]:
    return [(p, s) for p, row in enumerate(slots) for s, n in enumerate(row) if n is None]


def without(slots: Slots, leaving: set[int]) -> Slots:
    return [[None if n in leaving else n for n in row] for row in slots]


def react_leave(config: JobConfig, slots: Slots, leaving: set[int], *, noticed: set[int] = frozenset(),
                checkpoint_step: int | None = None) -> Reaction:
    """The next slots after `leaving` go (those in `noticed` got a notice and are still here), as
    the runtime's own plan has them (`runtime.distributed.membership.plan_for_fleet`): go on (a noticed node
    the job cannot do without yet stays, deferred), `restart` from the job's newest checkpoint
    (`checkpoint_step`) when every copy of some layer is gone, `wait` for replacements (a strategy
    that restarts from its checkpoint), or `fail` (the state is lost: no replacement can bring it
    back)."""
    plan = plan_for_fleet(config, slots, gone=leaving - noticed, noticed=noticed & leaving,
                          checkpoint_step=checkpoint_step)
    if plan.error is not None:
        return Reaction(decision="fail", slots=None, reason=f"the job cannot continue: {plan.error}")
    if plan.waiting is not None:
        return Reaction(decision="wait", slots=None, reason=plan.waiting)
    nxt = plan.slots
    deferred = plan.deferred
    reason = f"{len(leaving)} node(s) left; {len(holes(nxt))} hole(s)"
    if deferred:
        reason += f"; {len(deferred)} noticed node(s) stay until a replacement joins"
    if plan.restore_step is not None and not get_strategy(config.strategy).restarts_from_checkpoint:
        # Every copy of some layer is gone: the survivors restart from the newest checkpoint.
        return Reaction(decision="restart", slots=nxt, reason=f"{reason}; {plan.reason.split(': ', 1)[-1]}")
    return Reaction(decision=get_strategy(config.strategy).decision, slots=nxt, reason=reason)


def react_join(config: JobConfig, slots: Slots, joiners: list[int]) -> Reaction:
    """Slots after `joiners` fill holes (the job grows back), as the runtime's plan has them."""
    plan = plan_for_fleet(config, slots, gone=set(), noticed=set(), joiners=joiners)
    if not plan.runs:
        return Reaction(decision="wait", slots=None, reason=plan.error or plan.waiting or "")
    nxt = plan.slots
    return Reaction(decision="grow", slots=nxt, reason=f"{len(joiners)} node(s) joined; {len(holes(nxt))} hole(s)")


def assign_nodes(slots: Slots, previous: dict[int, int] | None) -> dict[int, int]:
    """Runtime node ids of the slotted instances. The first generation numbers them as the
    runtime's full layout does (pipeline p, stage s -> p * pp + s); later, members keep their id and
    newcomers get fresh ones (a replacement is a new node to the runtime)."""
    pp = len(slots[0]) if slots else 0
    if not previous:
        return {inst: p * pp + s for p, row in enumerate(slots) for s, inst in enumerate(row) if inst is not None}
    nodes = dict(previous)
    fresh = max(nodes.values(), default=-1) + 1
    for inst in alive(slots):
        if inst not in nodes:
            nodes[inst] = fresh
            fresh += 1
    return nodes


def membership_of(slots: Slots, nodes: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """JobGeneration.membership: one entry per slotted instance; rank = order in the grid; `node`
    = the instance's runtime node id."""
    nodes = nodes or assign_nodes(slots, None)
    members = []
    for p, row in enumerate(slots):
        for s, instance in enumerate(row):
            if instance is not None:
                members.append({"instance": instance, "rank": len(members), "pipeline": p, "stage": s,
                                "node": nodes[instance]})
    return members
