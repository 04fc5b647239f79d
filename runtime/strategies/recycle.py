"""`recycle`: re-route a lost node's micro-batches to surviving nodes; stages and math unchanged.

Only the lost hop moves: micro-batch m of pipeline p still runs every other stage on pipeline p's
nodes. ReCycle sends the lost stage-s hop to the surviving stage-s nodes of the other pipelines
(round-robin, the default); they hold the stage already, so no state moves. The
split-backward (`fiw`) schedule puts backward-input on the critical path and defers backward-weight
into bubbles, which is where the re-routed work fits; each node steps its optimizer as soon as its
own all-reduce is done.

With few pipelines that cannot be enough: at DP=2 the one peer computes 2M micro-batches of its
stage per step, and no schedule (not even one overlapping consecutive steps) runs a step faster
than that node's work: at DP=2 x PP=4, M=4, 192 ms against the 120 ms failure-free `fiw` step,
a bound of 0.625 (see docs/runtime.md). *Spill* (`recycle_spill`, on by default; off is ReCycle as
published) also lets other survivors host a lost hop, even of a stage whose slot holders are all
gone: each lost hop goes to the survivor with the lowest load score (per-node scores in heaps, so
the plan scales with nodes x lost hops), and while a budget of list-schedule tasks lasts the
candidate placements (with the old search's greedy among them) are compared and refined by their
exact step (`runtime.strategies.spill`; hosts pay for the stage traffic they add, priced from the
job's stated bandwidth, `runtime.strategies.links`;
ties: a same-stage peer, a node already on the route, a later pipeline's node; before 2026-11-25
every candidate of every hop was scored by a whole `schedule_length`, seconds at 32 nodes and
minutes at 64: `bench/_spill_baseline.py`). A node that hosts a stage it did not hold
fetches a copy of its layers at the regroup, like any layer transfer; the global batch, data order
and the math are unchanged.
"""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Layout, pipelines_layout
from runtime.parallel.schedule import job_durations, stated_layer_times
from runtime.strategies.base import Slots, alive_nodes
from runtime.strategies.links import link_costs
from runtime.strategies.spill import LinkCosts, Routes, place_lost_hops


class RecycleStrategy:
    """Keep the full layout's stages and routes; patch each missing hop with a surviving node.

    Spill scores hosts in seconds with what taking on a stage costs beyond compute (its all-reduce)
    from the job's own config (`runtime.strategies.links.link_costs`: its stated bandwidth, its
    layers' parameter bytes and device time), so every survivor, the simulator and the planner get
    the same placement; compute only where the config states too little. `costs` (optional)
    replaces that with another `LinkCosts` (tests: a cost model of a slow or free network)."""

    name = "recycle"
    decision = "reroute"
    restarts_from_checkpoint = False
    falls_back_to_checkpoint = True
    simulated_schedule = "fiw"  # re-routed work fits F-I-W's bubbles
    plans_from_count = False
    plans_per_row = False
    rows_interchangeable = False  # spill breaks ties by pipeline (a later one's node hosts first): states keyed exactly
    recovery_s = 2.0 + 5.0  # re-routing the micro-batches, then detection
    batches_joiners = False  # a joiner fills a hole with a switch

    def __init__(self, costs: LinkCosts | None = None) -> None:
        self.costs = costs

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        base, routes, lost = peer_routes(config, slots)
        if config.recycle_spill and lost:
            costs = self.costs if self.costs is not None else link_costs(config)
            return _spill(config, base, routes, lost, slots, costs)
        return base.with_routes(routes)


def peer_routes(config: JobConfig, slots: Slots) -> tuple[Layout, Routes, list[tuple[int, int]]]:
    """ReCycle's re-routing before any spill: the full layout (its stage boundaries, with
    placeholder nodes), every micro-batch's route with each hop of a lost slot given to the
    surviving same-stage peers in turn (-1 where a stage has none left), and those lost
    `(micro-batch, hop)`s. Raises `LayoutError` when a stage has no peer and spill cannot help."""
    # Stage boundaries come from the full layout; placeholder nodes keep routes well-formed.
    placeholder = [[p * config.pp + s for s in range(config.pp)] for p in range(config.dp)]
    base = pipelines_layout(config, placeholder)
    peers: list[list[int]] = []
    for s in range(config.pp):
        alive = [n for row in slots if (n := row[s]) is not None]
        # With spill, a stage whose slot holders are all gone can still be hosted by other
        # survivors (they fetch its layers from any node that holds a copy, e.g. an earlier
        # spill host; the plan fails naming the layer when none does).
        if not alive and not (config.recycle_spill and alive_nodes(slots)):
            raise LayoutError(
                f"recycle has no surviving node for stage {s}; expected at least one per stage"
            )
        peers.append(alive)
    routes: Routes = []
    lost: list[tuple[int, int]] = []  # (micro-batch, hop) whose node is gone
    turn = [0] * config.pp
    # A route without a lost hop is the same for all of its pipeline's micro-batches: built
    # once and shared (read-only, like every route handed on from here).
    whole: dict[tuple[tuple[tuple[int, int], ...], int], list[tuple[int, int]]] = {}
    for m, (route, p) in enumerate(zip(base.routes, base.pipeline_of, strict=True)):
        hops = whole.get((route, p))
        if hops is None:
            hops = []
            patched = len(lost)
            for h, (stage, _) in enumerate(route):
                node = slots[p][stage]
                if node is None:
                    node = peers[stage][turn[stage] % len(peers[stage])] if peers[stage] else -1
                    turn[stage] += 1
                    lost.append((m, h))
                hops.append((stage, node))
            if len(lost) == patched:
                whole[(route, p)] = hops
        routes.append(hops)
    return base, routes, lost


def _spill(
    config: JobConfig,
    base: Layout,
    routes: list[list[tuple[int, int]]],
    lost: list[tuple[int, int]],
    slots: Slots,
    costs: LinkCosts | None,
) -> Layout:
    """Place the lost hops on survivors (`runtime.strategies.spill`), scored on the schedule the
    nodes will build (`job_durations`: the job's own times, in its own unit, since the list
    scheduler's ties depend on them) plus, with `costs`, each stage's join cost in that unit. A job
    that states no times but is handed `costs` is scored in the costs' seconds."""
    durations = job_durations(config, base)
    if costs is None:
        return base.with_routes(place_lost_hops(base, routes, lost, slots, durations, config.schedule))
    holders = {s: sum(row[s] is not None for row in slots) for s in range(len(base.stages))}
    stated = stated_layer_times(config)
    if stated is None:
        durations, per_second = costs.stage_compute(base.stages), 1.0
    else:
        per_second = 1.0 / stated[1]
    join = {stage: t * per_second for stage, t in costs.stage_join_times(base.stages, holders).items()}
    return base.with_routes(place_lost_hops(base, routes, lost, slots, durations, config.schedule, join))
