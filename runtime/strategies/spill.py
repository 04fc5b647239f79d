"""Recycle's *spill*: place a lost node's hops on survivors at a cost that grows with nodes x lost hops.

A lost hop (micro-batch m, hop h of stage s) may go to any survivor. Each placement is scored by the
change it makes to the host's load, not by re-running the list schedule: the host's work (F+I+W of
every hop it runs) plus, in the `head` score, the idle time its own stage has before the first
forward reaches it (a later-stage node starts later, so it has less room in one step). Hops are
placed greedily in micro-batch order on the lowest score; ties prefer a same-stage peer (no layers
to copy), then a node already on the micro-batch's route (local hand-over), then the lowest id.
Node scores sit in a heap, so a hop costs O(pp + log nodes).

A host must not make a pipeline visit two nodes in both orders (one micro-batch A then B, another B
then A): with the list scheduler's per-(node, pipeline) memory cap that can deadlock. So a host is
either new to the micro-batch's pipeline, already used by it at the same hop, or the route's own
neighbour (h - 1 or h + 1), which keeps every route's order.

When the layout is small enough (`EXACT_BUDGET_TASKS`), the candidates (each score's placement and
ReCycle's round-robin over same-stage peers) are compared by their exact `schedule_length` and the
shortest wins; the budget is counted in list-schedule tasks, so the result is a pure function of the
inputs (every survivor computes the same plan).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable

from runtime.layout import Hop, Layout
from runtime.schedule import Durations, ScheduleError, independent_parts, schedule_length

EXACT_BUDGET_TASKS = 3000
"""Tasks the exact comparison may list-schedule in all (about 20-30 ms on this 2-core host)."""

Routes = list[list[Hop]]

SCORES = ("head", "load", "ends")
"""Placement scores, in order of preference when there is no budget to compare them exactly: the
host's load plus its stage's idle head (`head`), plus head and drain (`ends`), or the load alone."""


def place_lost_hops(
    base: Layout,
    routes: Routes,
    lost: list[tuple[int, int]],
    peers: list[list[int]],
    survivors: list[int],
    durations: Durations,
    schedule: str,
) -> Routes:
    """Routes with every lost `(micro-batch, hop)` on a survivor; `routes` holds ReCycle's
    round-robin peer (or -1 where a stage has no peer left) at those hops and is not changed."""
    candidates: list[Routes] = []
    for score in SCORES:
        candidates.append(_greedy(base, routes, lost, peers, survivors, durations, score))
    if all(routes[m][h][1] >= 0 for m, h in lost):
        candidates.append([list(r) for r in routes])
    unique: list[Routes] = []
    for c in candidates:
        if c not in unique:
            unique.append(c)
    if len(unique) == 1:
        return unique[0]
    return _shortest(base, unique, lost, peers, survivors, durations, schedule)


def _layout(base: Layout, routes: Routes) -> Layout:
    return Layout(
        num_layers=base.num_layers,
        stages=base.stages,
        routes=tuple(tuple(r) for r in routes),
        pipeline_of=base.pipeline_of,
        microbatch_size=base.microbatch_size,
    )


class _Exact:
    """Exact step lengths (`schedule_length`) while a budget of list-schedule tasks lasts."""

    def __init__(self, base: Layout, durations: Durations, schedule: str) -> None:
        self.base, self.durations, self.schedule = base, durations, schedule
        self.left = EXACT_BUDGET_TASKS

    def length(self, routes: Routes) -> float | None:
        """The step of `routes` (inf if it cannot be scheduled); None once the budget is spent."""
        layout = _layout(self.base, routes)
        # Groups of untouched pipelines repeat one shape: schedule_length runs each shape once.
        cost = 3 * sum(len(r) for part in set(independent_parts(layout)) for r in part.routes)
        if cost > self.left:
            self.left = 0
            return None
        self.left -= cost
        try:
            return schedule_length(layout, self.schedule, self.durations)
        except ScheduleError:
            return float("inf")


def _shortest(
    base: Layout,
    candidates: list[Routes],
    lost: list[tuple[int, int]],
    peers: list[list[int]],
    survivors: list[int],
    durations: Durations,
    schedule: str,
) -> Routes:
    """The candidate with the shortest exact step, then (budget left) each lost hop moved where that
    shortens the step: to where another candidate put it, a route neighbour, a same-stage peer, then
    any survivor, least loaded first.
    Without budget: the first candidate."""
    exact = _Exact(base, durations, schedule)
    best: tuple[float, Routes] | None = None
    for routes in candidates:
        length = exact.length(routes)
        if length is None:
            break
        if best is None or length < best[0] - 1e-9:
            best = (length, routes)
    if best is None or best[0] == float("inf"):
        return candidates[0]
    length, routes = best[0], [list(r) for r in best[1]]
    load = dict.fromkeys(survivors, 0.0)
    for route in routes:
        for stage, node in route:
            load[node] += sum(durations[stage])
    for _ in range(2):  # like a second greedy pass: earlier moves change what later hops should do
        for m, h in lost:
            stage = routes[m][h][0]
            # Where another candidate put it, the route's neighbours, the stage's peers.
            options = [other[m][h][1] for other in candidates]
            options += [routes[m][k][1] for k in (h - 1, h + 1) if 0 <= k < len(routes[m])]
            options += peers[stage]
            options += sorted(survivors, key=lambda n: (load[n], n))  # the rest, least loaded first
            for node in dict.fromkeys(options):
                if node == routes[m][h][1]:
                    continue
                trial = [list(r) for r in routes]
                trial[m][h] = (stage, node)
                found = exact.length(trial)
                if found is None:
                    return routes
                if found < length - 1e-9:
                    length, routes = found, trial
    return routes


def _greedy(
    base: Layout,
    routes: Routes,
    lost: list[tuple[int, int]],
    peers: list[list[int]],
    survivors: list[int],
    durations: Durations,
    score: str,
) -> Routes:
    routes = [list(r) for r in routes]
    cost = {stage: sum(d) for stage, d in durations.items()}
    lost_set = set(lost)
    load = dict.fromkeys(survivors, 0.0)
    own_stage: dict[int, int] = {}
    used: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))  # pipeline -> node -> hops
    for m, route in enumerate(routes):
        pipe = base.pipeline_of[m]
        for h, (stage, node) in enumerate(route):
            if (m, h) not in lost_set:
                load[node] += cost[stage]
                own_stage.setdefault(node, stage)
                used[pipe][node].add(h)
    # Idle time before the first forward reaches a node's own stage (stage ids are in layer order
    # for recycle's uniform pipelines).
    head_of = [0.0]
    for stage in range(len(base.stages) - 1):
        head_of.append(head_of[-1] + durations[stage][0])
    # ... and, for `ends`, the input-gradient drain after its last backward (stages before it).
    tail_of = [0.0]
    for stage in range(len(base.stages) - 1):
        tail_of.append(tail_of[-1] + durations[stage][1])

    def offset(n: int) -> float:
        if score == "load" or n not in own_stage:
            return 0.0
        return head_of[own_stage[n]] + (tail_of[own_stage[n]] if score == "ends" else 0.0)

    value = {n: load[n] + offset(n) for n in survivors}
    heap = [(v, n) for n, v in value.items()]
    heapq.heapify(heap)
    peer_heaps: list[list[tuple[float, int]]] = [[(value[n], n) for n in ps] for ps in peers]
    for h in peer_heaps:
        heapq.heapify(h)
    peer_set = [set(ps) for ps in peers]
    peer_stage = {n: s for s, ps in enumerate(peers) for n in ps}

    def top(h: list[tuple[float, int]], ok: Callable[[int], bool]) -> int | None:
        """Lowest-valued node of heap `h` that `ok` allows (stale entries dropped, others kept)."""
        aside = []
        found = None
        while h:
            v, n = h[0]
            if v != value[n]:
                heapq.heappop(h)
                continue
            if ok(n):
                found = n
                break
            aside.append(heapq.heappop(h))
        for entry in aside:
            heapq.heappush(h, entry)
        return found

    for m, h in lost:
        stage = routes[m][h][0]
        pipe = base.pipeline_of[m]
        neighbours = {routes[m][k][1] for k in (h - 1, h + 1) if 0 <= k < len(routes[m]) and (m, k) not in lost_set}
        on_route = {n for k, (_, n) in enumerate(routes[m]) if k != h}

        def ok(n: int, pipe: int = pipe, h: int = h, neighbours: set[int] = neighbours) -> bool:
            return used[pipe].get(n, set()) <= {h} or n in neighbours

        options = {top(heap, ok), top(peer_heaps[stage], ok) if peer_heaps[stage] else None}
        options |= {n for n in neighbours if n in value}
        options.discard(None)
        if not options:  # every survivor would reverse this pipeline's order; keep ReCycle's choice
            options = set(survivors)
        node = min(
            options,
            key=lambda n: (round(value[n] + cost[stage], 9), n not in peer_set[stage], n not in on_route, n),
        )
        routes[m][h] = (stage, node)
        lost_set.discard((m, h))
        used[pipe][node].add(h)
        load[node] += cost[stage]
        value[node] += cost[stage]
        heapq.heappush(heap, (value[node], node))
        if node in peer_stage:
            heapq.heappush(peer_heaps[peer_stage[node]], (value[node], node))
    return routes
