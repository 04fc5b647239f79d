"""How a job's membership reacts when nodes leave or join, per strategy. Pure functions on the
*slots* grid the runtime uses (`runtime.strategies.base`): `slots[p][s]` is the instance filling
stage s of pipeline p of the full DP x PP layout, or None for a hole.

The control plane decides *who* fills which slot and whether the job can keep going; the runtime's
strategy (`get_strategy(name).layout_for(config, slots)`) turns the slots into routes on the nodes.
No torch here: the Celery worker stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Slots = list[list[int | None]]

# What each strategy does with a hole (the Reconfiguration.decision values).
DECISIONS = {
    "recycle": "reroute",
    "bamboo": "takeover",
    "oobleck": "reinstantiate",
    "checkpoint": "restart",
    "none": "restart",
}


@dataclass(frozen=True, slots=True)
class Reaction:
    """The outcome of a leave or a join: the decision's name and the next slots, or `slots=None`
    when the job cannot run until replacements arrive (decision `wait`)."""

    decision: str
    slots: Slots | None
    reason: str


def runtime_strategy(job_strategy: str) -> str:
    """The runtime strategy for a job's strategy (`auto` means recycle: it keeps the global batch
    with no state transfer and no restart)."""
    return "recycle" if job_strategy in ("", "auto") else job_strategy


def full_slots(instance_ids: list[int], *, dp: int, pp: int) -> Slots:
    """The failure-free grid: instances in order, pipeline-major."""
    if len(instance_ids) < dp * pp:
        raise ValueError(f"{len(instance_ids)} instances cannot fill dp={dp} x pp={pp}")
    return [[instance_ids[p * pp + s] for s in range(pp)] for p in range(dp)]


def alive(slots: Slots) -> list[int]:
    return [n for row in slots for n in row if n is not None]


def holes(slots: Slots) -> list[tuple[int, int]]:
    return [(p, s) for p, row in enumerate(slots) for s, n in enumerate(row) if n is None]


def without(slots: Slots, leaving: set[int]) -> Slots:
    return [[None if n in leaving else n for n in row] for row in slots]


def fill(slots: Slots, joiners: list[int]) -> tuple[Slots, list[int]]:
    """Put joiners into holes, first pipeline and first stage first (as the runtime's fill_slots)."""
    out = [list(row) for row in slots]
    queue = list(joiners)
    for row in out:
        for s, node in enumerate(row):
            if node is None and queue:
                row[s] = queue.pop(0)
    return out, queue


def feasible(strategy: str, slots: Slots, *, min_stages: int = 1) -> tuple[bool, str]:
    """Can the runtime build a layout for these slots under `strategy`? (Why not, if not.)"""
    pp = len(slots[0]) if slots else 0
    if not alive(slots):
        return False, "no node left"
    if strategy == "recycle":
        empty = [s for s in range(pp) if all(row[s] is None for row in slots)]
        return (not empty, f"no surviving node for stage(s) {empty}" if empty else "")
    if strategy == "bamboo":
        # A lost node's successor in the pipeline holds its replica; two adjacent losses lose one.
        for p, row in enumerate(slots):
            for s in range(pp):
                if row[s] is None and row[(s + 1) % pp] is None and pp > 1:
                    return False, f"pipeline {p} lost stage {s} and its replica holder"
        return True, ""
    if strategy == "oobleck":
        ok = len(alive(slots)) >= min_stages
        return ok, "" if ok else f"{len(alive(slots))} nodes cannot hold a {min_stages}-stage template"
    # checkpoint / none: full pipelines of the survivors
    ok = len(alive(slots)) >= pp
    return ok, "" if ok else f"{len(alive(slots))} nodes cannot fill one pipeline of {pp} stages"


def react_leave(strategy: str, slots: Slots, leaving: set[int], *, min_stages: int = 1) -> Reaction:
    """Slots after `leaving` go, under `strategy`."""
    strategy = runtime_strategy(strategy)
    nxt = without(slots, leaving)
    ok, why = feasible(strategy, nxt, min_stages=min_stages)
    if not ok:
        return Reaction(decision="wait", slots=None, reason=why)
    return Reaction(decision=DECISIONS.get(strategy, "restart"), slots=nxt,
                    reason=f"{len(leaving)} node(s) left; {len(holes(nxt))} hole(s)")


def react_join(strategy: str, slots: Slots, joiners: list[int], *, min_stages: int = 1) -> Reaction:
    """Slots after `joiners` fill holes (the job grows back)."""
    strategy = runtime_strategy(strategy)
    nxt, _left = fill(slots, joiners)
    ok, why = feasible(strategy, nxt, min_stages=min_stages)
    if not ok:
        return Reaction(decision="wait", slots=None, reason=why)
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
