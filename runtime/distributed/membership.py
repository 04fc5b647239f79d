"""The plan of a generation: a pure function of who is alive, what they hold and the strategy.

One survivor (whoever gets there first) computes the plan and publishes it with an atomic
compare-and-set on the store; everyone else reads that same plan, so all members agree on the
layout, the step to resume from and which layer states move where. The plan itself is a typed
value, `runtime.distributed.generation_plan.GenerationPlan`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from runtime.checkpointing.durability import initial_durability, next_durability
from runtime.config import JobConfig, LayoutError
from runtime.distributed.generation_plan import GenerationPlan
from runtime.parallel.layout import Layout
from runtime.strategies import get_strategy
from runtime.strategies.base import Slots, alive_nodes, fill_slots, full_slots

LAYOUTS_REMEMBERED = 8
"""(config, slots) -> layout answers `layout_of` keeps (a process plans a few jobs at a time)."""
_layouts: OrderedDict[tuple[str, tuple[tuple[int | None, ...], ...]], Layout] = OrderedDict()
_layouts_guard = threading.Lock()


def layout_of(config: JobConfig, slots: Slots) -> Layout:
    """`get_strategy(config.strategy).layout_for(config, slots)`, remembered for the last few
    (config, slots). It is a pure function of them (every survivor computes the same plan from the
    same inputs), and a reaction asks first for the current generation's layout, which the reaction
    before it computed as its new one: at 1,024 nodes with a few holes, recycle's exact comparison
    of spill's placements makes each call 30-70 ms, and the control plane made it twice a notice.
    A `LayoutError` is raised each time (not remembered)."""
    key = (json.dumps(config.to_dict(), sort_keys=True, default=str), tuple(tuple(row) for row in slots))
    with _layouts_guard:
        found = _layouts.get(key)
        if found is not None:
            _layouts.move_to_end(key)
            return found
    layout = get_strategy(config.strategy).layout_for(config, slots)
    with _layouts_guard:
        _layouts[key] = layout
        while len(_layouts) > LAYOUTS_REMEMBERED:
            _layouts.popitem(last=False)
    return layout


def initial_plan(config: JobConfig, *, start_step: int = 0, started_at: float = 0.0) -> GenerationPlan:
    """Generation 0: the full layout at `start_step` (0, or where the `init_from` export it
    continues stopped); every node builds its layers from the seed (or loads them from init_from).
    `started_at`: the job's start (wall clock), for the failure rate (`runtime.checkpointing.durability`)."""
    slots = full_slots(config)
    layout = get_strategy(config.strategy).layout_for(config, slots)
    return GenerationPlan(generation=0, slots=slots, layout=layout, members=list(layout.nodes()),
                          start_step=start_step, reason="start", **initial_durability(config, started_at=started_at))


def joiners_worth_a_regroup(strategy: str, *, pp: int, filled: int, empty: int, waiting: int, waited_s: float,
                            wait_bound_s: float, urgent: bool = False) -> bool:
    """Whether `waiting` joiners (new join requests plus standing-by spares) are worth regrouping the
    job for now -- the one rule the runtime's worker and the simulator (`runtime.sim.engine`) follow.

    `filled` / `empty`: slots of the dp x pp grid with / without a node; `waited_s`: how long the
    oldest of them has waited; `urgent`: the job needs a replacement now (it cannot run without one,
    or a noticed node is kept until one joins). With no empty slot a joiner can only stand by. A
    strategy whose regroup is cheap (`batches_joiners` False) takes every joiner at once; one whose
    regroup is a restart or a re-instantiation waits until the joiners fill every empty slot or
    complete one more full pipeline (pp nodes) than the filled slots make, or until the oldest has
    waited `wait_bound_s` (`JobConfig.join_batch_wait_s`)."""
    if waiting <= 0:
        return False
    if urgent:
        return True
    if empty <= 0:
        return False
    if not get_strategy(strategy).batches_joiners:
        return True
    return waiting >= empty or (filled + waiting) // pp > filled // pp or waited_s >= wait_bound_s


def _give_back_slots(config: JobConfig, previous: GenerationPlan, alive: dict[int, dict[str, Any]]) -> Slots:
    """The previous slots, with a node that was leaving but is still here given a slot back.

    Such a node's hand-over failed (its receiver or another member died before the receiving
    generation committed a step), so it still holds what it was handing over. It goes back into an
    empty slot whose layers (in the full layout) are the ones it holds, so that, if the job still
    needs it, it is kept as `deferred` where its state is; otherwise it simply leaves again."""
    slots: Slots = [[n if n in alive else None for n in row] for row in previous.slots]
    placed = set(alive_nodes(slots))
    returning = [n for n in previous.leaving if n in alive and n not in placed]
    if not returning:
        return slots
    full = get_strategy(config.strategy).layout_for(config, full_slots(config))
    for node in returning:
        held = {int(layer) for layer in alive[node].get("versions", {})}
        empty = [(p, s) for p, row in enumerate(slots) for s, n in enumerate(row) if n is None]
        fits = [(p, s) for p, s in empty if full.layers_of(p * config.pp + s) <= held]
        if fits:
            p, s = fits[0]
            slots[p][s] = node
    return slots


class _Arrangement:
    """The next generation's slots for a choice of noticed nodes kept (`keep`): the grid with every
    other noticed node's slot emptied, filled from `candidates`, and its layout (or why none)."""

    def __init__(self, config: JobConfig, grid: Slots, alive: dict[int, dict[str, Any]], noticed: list[int],
                 candidates: list[int]) -> None:
        self.config, self.grid, self.alive, self.noticed, self.candidates = config, grid, alive, noticed, candidates

    def __call__(self, keep: set[int]) -> tuple[Slots, list[int], Layout | LayoutError]:
        staying = {n for n in self.alive if n not in self.noticed or n in keep}
        slots: Slots = [[n if n in staying else None for n in row] for row in self.grid]
        slots, extra = fill_slots(slots, self.candidates)
        try:
            if not self.alive:
                raise LayoutError("no member survived")
            return slots, extra, layout_of(self.config, slots)
        except LayoutError as exc:
            return slots, extra, exc

    def keeping_fewest_noticed(self) -> tuple[set[int], tuple[Slots, list[int], Layout | LayoutError]]:
        """(the noticed nodes kept, their arrangement). A node with a notice normally leaves now. If
        the job cannot go on without it (it is the last holder of a stage and no replacement has
        joined yet), it stays -- *deferred* -- and keeps training until a replacement joins, then
        hands its state over (or its deadline kills it and the job fails with a named reason). Keep
        as few noticed nodes as the layout needs."""
        deferred: set[int] = set()
        arranged = self(deferred)
        noticed = self.noticed
        if isinstance(arranged[2], LayoutError) and noticed and not isinstance(self(set(noticed))[2], LayoutError):
            deferred = set(noticed)
            for n in noticed:
                if not isinstance(self(deferred - {n})[2], LayoutError):
                    deferred.discard(n)
            arranged = self(deferred)
        return deferred, arranged


def _state_transfers(alive: dict[int, dict[str, Any]], leaving: list[int], layout: Layout,
                     start: int) -> list[tuple[int, int, int]] | str:
    """(layer, from node, to node) for every layer a member of `layout` must receive to resume at
    step `start`, or why it cannot (a layer with no surviving copy)."""
    holders: dict[int, list[int]] = {}
    # Staying nodes first so a leaving node is used as a source only when it holds the last copy.
    for n in sorted(alive, key=lambda n: (n in leaving, n)):
        for layer, version in alive[n]["versions"].items():
            if int(version) in (start, start + 1):
                holders.setdefault(int(layer), []).append(n)
    lay = Layout.from_dict(layout.to_dict())
    layers_of = lay.layers_by_node()
    transfers: list[tuple[int, int, int]] = []
    for node in lay.nodes():
        for layer in sorted(layers_of.get(node, ())):
            sources = holders.get(layer, [])
            if node in sources:
                continue
            if not sources:
                return (f"layer {layer} has no surviving copy at step {start} "
                        "(every node that held it is gone; no replica had it)")
            transfers.append((layer, sources[0], node))
    return transfers


def make_plan(
    config: JobConfig,
    *,
    generation: int,
    previous: GenerationPlan,
    alive: dict[int, dict[str, Any]],
    joiners: list[int],
    checkpoint_step: int | None,
    reason: str,
    spares: list[int] | None = None,
    now: float | None = None,
    gone_joiners: Collection[int] = (),
) -> GenerationPlan:
    """The next generation's plan.

    `alive` maps each responding old member to its record: `committed` (steps it knows committed),
    `versions` (layer -> optimizer steps applied) and `leaving` (it got a notice). A noticed node
    the job cannot do without yet is kept as a member and listed in `deferred`.
    `joiners` are the join requests new since `previous`; `spares` the previous plan's spares that
    are still alive (standing by outside the group). Both fill empty slots, spares first (they
    waited longest); whoever gets no slot is listed in `spare` and stands by for a later plan.
    `gone_joiners`: joiners known dead (one told to stand by may die before a plan takes it): counted
    in `joins_consumed` like the others, never placed.
    `checkpoint_step`: the newest complete checkpoint (None: none). A strategy that keeps state
    alive without one (recycle, bamboo, oobleck) restarts from it only when a change lost every copy
    of some layer (`_restart_or_fail`). `now`: wall clock, for the failure rate that sets the next
    checkpoint interval (`runtime.checkpointing.durability`; None: no time has passed).
    """
    strategy = get_strategy(config.strategy)
    candidates = [*(spares or []), *(n for n in joiners if n not in (spares or []) and n not in gone_joiners)]
    noticed = sorted(n for n, rec in alive.items() if rec.get("leaving"))
    lost = sorted(set(previous.members) - set(alive))
    arrange = _Arrangement(config, _give_back_slots(config, previous, alive), alive, noticed, candidates)
    deferred, (slots, extra, layout) = arrange.keeping_fewest_noticed()
    leaving = [n for n in noticed if n not in deferred]
    base = GenerationPlan(
        generation=generation,
        slots=slots,
        leaving=leaving,
        deferred=sorted(deferred),
        lost=lost,
        joined=[n for n in candidates if n not in extra],
        joins_consumed=previous.joins_consumed + len(joiners),
        reason=reason,
        # Checkpoints guard against the failures that need them: for a strategy that keeps state alive
        # on its survivors, a loss counts only when it took every copy of some layer (no layout). At
        # fleet size nodes go every few seconds, and counting each would checkpoint every few seconds.
        **next_durability(config, started_at=previous.started_at, failures=previous.failures,
                          lost=bool(lost) and (strategy.restarts_from_checkpoint or isinstance(layout, LayoutError)),
                          records=alive, now=previous.started_at if now is None else now),
    )
    fallback = {"alive": alive, "noticed": noticed, "candidates": candidates, "checkpoint_step": checkpoint_step}
    if isinstance(layout, LayoutError):
        if strategy.restarts_from_checkpoint and alive:
            # The state comes back from the checkpoint whoever runs it: wait for replacements
            # (a plan with `waiting` and no layout; the next join forms the next generation).
            return dataclasses.replace(
                base,
                waiting=str(layout),
                members=sorted(set(alive_nodes(slots)) | set(extra)),
                joined=candidates,  # every candidate is a member here (none is a spare)
                start_step=max(int(rec["committed"]) for rec in alive.values()),
            )
        return _restart_or_fail(config, base, str(layout), **fallback)
    start = max(int(rec["committed"]) for rec in alive.values())
    transfers: list[tuple[int, int, int]] = []
    restore = None
    if strategy.restarts_from_checkpoint:
        restore = checkpoint_step or 0
        start = restore
    elif start > 0:
        transfers = _state_transfers(alive, leaving, layout, start)
        if isinstance(transfers, str):
            return _restart_or_fail(config, base, transfers, **fallback)
    return dataclasses.replace(base, layout=layout, members=list(layout.nodes()), spare=extra, start_step=start,
                               restore_step=restore, transfers=transfers)


def _restart_or_fail(config: JobConfig, base: GenerationPlan, lost_state: str, *, alive: dict[int, dict[str, Any]],
                     noticed: list[int], candidates: list[int], checkpoint_step: int | None) -> GenerationPlan:
    """The plan when the state is lost (`lost_state` says what): for a strategy that falls back to
    checkpoints, a restart from the newest complete one -- the survivors (but noticed ones, who
    leave) and the candidates packed into fresh slots pipeline by pipeline and laid out by the
    strategy itself (so later plans go on from these slots as usual), every member loading its
    layers from the checkpoint and replaying the steps since; otherwise, or with no checkpoint, the
    error that ends the job."""
    if not get_strategy(config.strategy).falls_back_to_checkpoint:
        return dataclasses.replace(base, error=lost_state)
    if checkpoint_step is None:
        return dataclasses.replace(base, error=f"{lost_state}; no checkpoint was available to restart from")
    staying = [n for n in sorted(alive) if n not in noticed]
    slots, extra = fill_slots([[None] * config.pp for _ in range(config.dp)],
                              [*staying, *(n for n in candidates if n not in staying)])
    try:
        layout = get_strategy(config.strategy).layout_for(config, slots)
    except LayoutError as exc:
        return dataclasses.replace(base, error=f"{lost_state}; restarting from the checkpoint of step "
                                               f"{checkpoint_step} failed too: {exc}")
    return dataclasses.replace(
        base, slots=slots, leaving=list(noticed), deferred=[], joined=[n for n in candidates if n not in extra],
        layout=layout, members=list(layout.nodes()), spare=extra, start_step=checkpoint_step,
        restore_step=checkpoint_step, transfers=[],
        reason=f"{base.reason}: {lost_state}; restored from checkpoint step {checkpoint_step}",
    )


def plan_for_fleet(
    config: JobConfig, slots: Slots, *, gone: set[int], noticed: set[int], joiners: list[int] | None = None,
    checkpoint_step: int | None = None,
) -> GenerationPlan:
    """The plan the survivors will agree on, from what the control plane knows of the fleet: the
    current generation's `slots`, the members that are `gone` (dead), those `noticed` (an
    interruption notice: still here, leaving) and the nodes that joined. Every member is taken to
    hold the layers its slot holds in the current layout, at the same step (the control plane
    does not see the step or extra copies; with them the survivors can only do better).

    The answer is `make_plan`'s, the runtime's own: a `layout` (go on; `deferred` lists noticed
    members kept until a replacement joins), `waiting` (a strategy that restarts from its
    checkpoint waits for replacements) or an `error` (the state is lost: the job cannot continue).
    `checkpoint_step`: the newest complete checkpoint the control plane found in the job's folder
    (None: none), which lets a strategy that falls back to checkpoints restart instead of failing.
    Torch-free, so the control plane asks it instead of keeping rules of its own."""
    strategy = get_strategy(config.strategy)
    restorable = strategy.restarts_from_checkpoint or (
        strategy.falls_back_to_checkpoint and checkpoint_step is not None)
    if not strategy.falls_back_to_checkpoint:
        checkpoint_step = None
    current = layout_of(config, slots)
    members = alive_nodes(slots)
    held = current.layers_by_node()
    step = 1  # any step > 0: the holders of every layer are checked, as after a real step
    alive = {
        n: {"committed": step, "versions": dict.fromkeys(map(str, held.get(n, ())), step), "leaving": n in noticed}
        for n in members
        if n not in gone
    }
    if not alive:
        empty: Slots = [[None] * len(row) for row in slots]
        if restorable:  # replacements restore the last checkpoint
            return GenerationPlan(generation=1, slots=empty, waiting="no member survived; replacements restore it")
        return GenerationPlan(generation=1, slots=empty,
                              error="no member survived and the strategy keeps no checkpoint")
    previous = GenerationPlan(generation=0, slots=slots, members=members)
    return make_plan(config, generation=1, previous=previous, alive=alive, joiners=list(joiners or []),
                     checkpoint_step=step if strategy.restarts_from_checkpoint else checkpoint_step, reason="fleet")
