"""Recycle's spill placement as it was up to main fd69199: every candidate of every lost hop scored by
a whole list schedule (`schedule_length`), greedily and then once more. Kept, unchanged, as the
baseline `python -m bench scale` and the planner's tests compare the scalable placement with
(`runtime.strategies.recycle`); affordable up to about 32 nodes."""

from __future__ import annotations

from runtime.config import JobConfig
from runtime.parallel.layout import Layout
from runtime.parallel.schedule import schedule_length, stage_durations
from runtime.strategies.base import Slots, alive_nodes
from runtime.strategies.recycle import peer_routes


def baseline_layout_for(config: JobConfig, slots: Slots) -> Layout:
    """`RecycleStrategy.layout_for` with spill as it was: the same routes (recycle's own
    `peer_routes`), the old placement."""
    base, shared, lost = peer_routes(config, slots)
    routes = [list(r) for r in shared]  # the search below writes into the routes
    peers = [[n for row in slots if (n := row[s]) is not None] for s in range(config.pp)]
    if config.recycle_spill and lost:
        return spill_by_schedule_search(config, base, routes, lost, peers, alive_nodes(slots))
    return base.with_routes(routes)


def spill_by_schedule_search(
    config: JobConfig,
    base: Layout,
    routes: list[list[tuple[int, int]]],
    lost: list[tuple[int, int]],
    peers: list[list[int]],
    survivors: list[int],
) -> Layout:
    """Place the lost hops to shorten the estimated step (`schedule_length`): greedily in micro-batch
    order, then a second pass that may move each hop again. Candidates for a hop are its same-stage
    peers and the least-loaded survivors, which keeps the search to a few dozen list schedules (every
    survivor computes the plan at once at the rendezvous). Deterministic: a pure function."""
    dt = config.device_time
    per_layer = (dt.forward_ms, dt.backward_input_ms, dt.backward_weight_ms) if dt else (1.0, 1.0, 1.0)
    durations = stage_durations(base, [per_layer] * base.num_layers)
    cost = {stage: sum(d) for stage, d in durations.items()}
    load = dict.fromkeys(survivors, 0.0)
    for m, h in lost:
        routes[m][h] = (routes[m][h][0], -1)  # not placed yet
    for route in routes:
        for stage, node in route:
            if node >= 0:
                load[node] += cost[stage]

    def length(trial: list[list[tuple[int, int]]]) -> float:
        # Micro-batches with a hop not placed yet are left out of the estimate.
        kept = [i for i, r in enumerate(trial) if all(n >= 0 for _, n in r)]
        layout = base.with_routes([trial[i] for i in kept], [base.pipeline_of[i] for i in kept])
        return round(schedule_length(layout, config.schedule, durations), 9)

    def place(m: int, h: int) -> None:
        stage, current = routes[m][h]
        if current >= 0:
            load[current] -= cost[stage]
        least = min(load.values())
        candidates = [n for n in survivors if load[n] <= least + 1e-9 or n in peers[stage]]
        on_route = {n for _, n in routes[m]}
        best: tuple | None = None
        for node in candidates:
            trial = [list(r) for r in routes]
            trial[m][h] = (stage, node)
            # Ties: a same-stage peer (no copy), a node of the route (local hand-over), the lowest id.
            rank = (length(trial), node not in peers[stage], node not in on_route, node)
            if best is None or rank < best[0]:
                best = (rank, node)
        assert best is not None
        routes[m][h] = (stage, best[1])
        load[best[1]] += cost[stage]

    for _ in range(2):
        for m, h in lost:
            place(m, h)
    return base.with_routes(routes)
