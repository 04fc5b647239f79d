"""Recycle's *spill*: place a lost node's hops on survivors at a cost that grows with nodes x lost hops.

A lost hop (micro-batch m, hop h of stage s) may go to any survivor. A placement is scored by the
change it makes to the host's load, not by re-running the list schedule for every candidate: the
host's work (F+I+W of every hop it runs) plus, in the preferred `head` score, the idle time its own
stage has before the first forward reaches it (a later-stage node starts later, so it has less room
in one step); the `load` score is the work alone. Hops are placed greedily in micro-batch order on
the lowest score, with node scores in heaps: O(pp + log nodes) per hop.

Ties prefer a same-stage peer (no layers to copy), then a node on the micro-batch's route (local
hand-over), then a node of a later pipeline (the list schedule then ranks the guest micro-batch,
whose pipeline has the hole, before the host's own), then the lowest id. A host must not make a
pipeline visit two nodes in both orders (one micro-batch A then B, another B then A): with the list
scheduler's per-(node, pipeline) memory cap that can deadlock. So a host is new to the
micro-batch's pipeline, already used by it at the same hop, or the route's own neighbour (h - 1 or
h + 1), which keeps every route's order.

Then, within a budget of list-schedule tasks (`exact_budget`: a pure function of the layout's size,
counted, not timed, so the plan stays a pure function of the inputs and every survivor computes the
same one), placements are compared by their exact step: the candidates (each score's placement and
ReCycle's round-robin over same-stage peers), the schedule-search spill's own greedy (each hop in
turn on the same-stage peer or least-loaded survivor that makes the partial plan shortest, twice over:
`bench/_spill_baseline.py`, which took seconds at 32 nodes), and each of these improved by single-hop
moves. Only the pipelines a placement touches (and one untouched pipeline, which stands for the rest)
are scheduled, each group of pipelines that share no node once per plan, so a move pays only for the
group it changes. A small layout (`SMALL_LAYOUT_TASKS`: up to 16 nodes of pp = 8 with 8 micro-batches
per pipeline) gets `SMALL_BUDGET_TASKS`, enough for the whole search in the random cases the tests
draw (within 5% of the schedule-search spill on each); a larger one gets `EXACT_BUDGET_TASKS`. When
checking the first placement alone would take over half the budget (from about 64 nodes of pp = 8: a
lost node's pipeline and its hosts' pipelines), nothing could be compared and the `head` placement is
the plan unchecked.

Traffic: given `join` times (the cost model's `stage_join_times`, in the unit of the durations), a
host that takes on a stage it does not hold pays that stage's all-reduce and update once, in its
score and, as the longest such tail over hosts, in every exact comparison; so spill moves a hop off
the same-stage peers only where the compute it saves outweighs the traffic it adds.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Protocol

from runtime.parallel.layout import Hop, Layout
from runtime.parallel.schedule import Durations, ScheduleError, independent_parts, schedule_length

EXACT_BUDGET_TASKS = 3000
"""Tasks the exact comparison may list-schedule in all (about 20-30 ms on this 2-core host)."""
SMALL_LAYOUT_TASKS = 512
"""A layout of at most this many list-schedule tasks (16 nodes of pp 8, or 4 x 4, with 8 micro-batches
per pipeline) is small enough to search: its plan gets `SMALL_BUDGET_TASKS`. Not 32 nodes: the simulator plans
hundreds of 4 x 8 states per trace (`bench simulate`: 43 s instead of 12 s on the p3 trace with 32
nodes included), and 4 x 8 plans stay within 5% of the schedule-search spill on 3,000 tasks."""
SMALL_BUDGET_TASKS = 10000
"""Tasks a small layout's search may list-schedule: 41-60 ms of CPU per plan at 8 and 16 nodes with
1-4 dead on this 2-core host (40,000 took 165-240 ms: a recovery waits for its plan, so the kill ->
next commit goal of 0.5 s caps it), still within 5% of the schedule-search spill in the tests'
random cases."""


def exact_budget(whole_layout_tasks: int) -> int:
    """List-schedule tasks a plan may spend comparing placements: a pure function of the layout's
    size (counted, never timed, so every survivor computes the same plan)."""
    return SMALL_BUDGET_TASKS if whole_layout_tasks <= SMALL_LAYOUT_TASKS else EXACT_BUDGET_TASKS



class LinkCosts(Protocol):
    """Seconds of compute and of a stage's join, from the cost model that prices the step
    (`runtime.parallel.throughput.CostModel`), so spill's score and the step have one owner."""

    def stage_compute(self, stages: tuple[tuple[int, int], ...]) -> Durations:
        """Stage id -> (F, I, W) seconds of one micro-batch."""
        ...

    def stage_join_times(self, stages: tuple[tuple[int, int], ...], holders: dict[int, int]) -> dict[int, float]:
        """Stage id -> what a node that does not hold the stage pays for taking it on."""
        ...


Routes = list[list[Hop]]
Placement = dict[tuple[int, int], int]
"""(micro-batch, hop) -> host node."""


def place_lost_hops(
    base: Layout,
    routes: Routes,
    lost: list[tuple[int, int]],
    slots: list[list[int | None]],
    durations: Durations,
    schedule: str,
    join: dict[int, float] | None = None,
) -> Routes:
    """Routes with every lost `(micro-batch, hop)` on a survivor. `routes` holds ReCycle's
    round-robin peer (or -1 where a stage has no peer left) at those hops; it is not changed.

    `join` (stage -> time, in the unit of `durations`): what a host that does not hold a stage pays
    once for taking it on, beyond the compute: its share of that stage's gradient all-reduce and
    optimizer update at the end of the step (`runtime.parallel.throughput.CostModel.stage_join_times`,
    the simulator's own cost model). None: compute only (unit costs, or no network model)."""
    job = _Job(base, routes, lost, slots, durations, schedule, join or {})
    first = job.by_load(head=True)
    exact = _Exact(job)
    if exact.unchecked(first):
        chosen = first  # what `best` returns then, without building the other candidates
    else:
        candidates = [first, job.by_load(head=False)]
        if all(routes[m][h][1] >= 0 for m, h in lost):
            candidates.append({(m, h): routes[m][h][1] for m, h in lost})
        unique: list[Placement] = []
        for c in candidates:
            if c not in unique:
                unique.append(c)
        chosen = exact.best(unique)
    out = [list(r) for r in routes]
    for (m, h), node in chosen.items():
        out[m][h] = (routes[m][h][0], node)
    return out


class _Job:
    """What both scores need, computed once from the slots (O(nodes + micro-batches))."""

    def __init__(
        self,
        base: Layout,
        routes: Routes,
        lost: list[tuple[int, int]],
        slots: list[list[int | None]],
        durations: Durations,
        schedule: str,
        join: dict[int, float],
    ) -> None:
        self.base, self.routes, self.lost, self.durations, self.schedule = base, routes, lost, durations, schedule
        self.join = join
        self.lost_set = set(lost)
        self.lost_mbs = {m for m, _ in lost}
        self.cost = {stage: sum(d) for stage, d in durations.items()}
        self.first_mb: dict[int, int] = {}
        self.count: dict[int, int] = defaultdict(int)
        for m, p in enumerate(base.pipeline_of):
            self.first_mb.setdefault(p, m)
            self.count[p] += 1
        self.home: dict[int, tuple[int, int]] = {}  # node -> (pipeline, stage)
        self.stage_nodes: list[list[int]] = [[] for _ in base.stages]
        for p, row in enumerate(slots):
            for s, node in enumerate(row):
                if node is not None:
                    self.home[node] = (p, s)
                    self.stage_nodes[s].append(node)
        self.survivors = sorted(self.home)
        # Among equal scores, hosts of later pipelines first: a guest micro-batch's lower index then
        # outranks the host's own work in the list schedule, so the pipeline with the hole waits less.
        self.order = {n: (-p, n) for n, (p, _) in self.home.items()}
        self.load = {n: self.count[p] * self.cost[s] for n, (p, s) in self.home.items()}
        self.pipes = sorted(self.count)

    def neighbours(self, m: int, h: int) -> list[int]:
        route = self.routes[m]
        return [route[k][1] for k in (h - 1, h + 1) if 0 <= k < len(route) and (m, k) not in self.lost_set]

    def allowed(
        self, node: int, m: int, h: int, extra: dict[int, dict[int, set[int]]], near: list[int] | None = None
    ) -> bool:
        """Keeps the pipeline's node order (see the module docstring). `near`: `neighbours(m, h)`."""
        pipe = self.base.pipeline_of[m]
        if near is None:
            near = self.neighbours(m, h)
        if self.home[node][0] == pipe:
            return node in near
        return extra[pipe].get(node, set()) <= {h} or node in near

    def join_cost(self, node: int, stage: int, joined: set[tuple[int, int]]) -> float:
        """What `node` pays for taking on `stage` (0 for its own stage or one it already took on)."""
        if self.home[node][1] == stage or (node, stage) in joined:
            return 0.0
        return self.join.get(stage, 0.0)

    def join_tail(self, placement: Placement) -> float:
        """The longest end-of-step tail the placement adds: per host, the joins of the stages it
        takes on (its all-reduces and updates run one after another; each stage's all-reduce ends
        with its last member, so the whole step waits for the slowest host)."""
        if not self.join:
            return 0.0
        taken = {(node, self.routes[m][h][0]) for (m, h), node in placement.items()}
        tail: dict[int, float] = defaultdict(float)
        for node, stage in taken:
            tail[node] += self.join_cost(node, stage, set())
        return max(tail.values(), default=0.0)

    def _rank(self, node: int, stage: int, route_nodes: list[int], h: int, score: float) -> tuple:
        """Ties: a same-stage peer, a node on the route (at a hop other than h), a later pipeline."""
        peer = self.home[node][1] == stage
        on_route = route_nodes.count(node) > (route_nodes[h] == node)
        return (round(score, 9), not peer, not on_route, self.order[node])

    # -- scores -----------------------------------------------------------------------------------
    def by_load(self, *, head: bool) -> Placement:
        """Greedy on the host's load (+ its stage's idle head); a heap of node scores."""
        head_of = [0.0]
        for stage in range(len(self.base.stages) - 1):
            head_of.append(head_of[-1] + self.durations[stage][0])
        value = {n: self.load[n] + (head_of[self.home[n][1]] if head else 0.0) for n in self.survivors}
        heap = [(v, self.order[n], n) for n, v in value.items()]
        heapq.heapify(heap)
        peer_heaps = [[(value[n], self.order[n], n) for n in nodes] for nodes in self.stage_nodes]
        for ph in peer_heaps:
            heapq.heapify(ph)
        extra: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
        joined: set[tuple[int, int]] = set()
        out: Placement = {}
        for m, h in self.lost:
            route = self.routes[m]
            stage = route[h][0]
            near = self.neighbours(m, h)
            options = {
                self._top(heap, value, m, h, extra, near),
                self._top(peer_heaps[stage], value, m, h, extra, near),
            }
            options |= {n for n in near if n in value}
            options.discard(None)
            if not options:  # every survivor would reverse this pipeline's order
                options = set(self.survivors)
            route_nodes = [n for _, n in route]
            node = min(options, key=lambda n: self._rank(
                n, stage, route_nodes, h, value[n] + self.cost[stage] + self.join_cost(n, stage, joined)))
            out[(m, h)] = node
            extra[self.base.pipeline_of[m]][node].add(h)
            value[node] += self.cost[stage] + self.join_cost(node, stage, joined)
            joined.add((node, stage))
            heapq.heappush(heap, (value[node], self.order[node], node))
            heapq.heappush(peer_heaps[self.home[node][1]], (value[node], self.order[node], node))
        return out

    def _top(self, heap: list, value: dict, m: int, h: int, extra: dict, near: list[int]) -> int | None:
        """Lowest-valued allowed node of a heap (stale entries dropped, disallowed ones kept)."""
        aside, found = [], None
        while heap:
            v, _, n = heap[0]
            if v != value[n]:
                heapq.heappop(heap)
                continue
            if self.allowed(n, m, h, extra, near):
                found = n
                break
            aside.append(heapq.heappop(heap))
        for entry in aside:
            heapq.heappush(heap, entry)
        return found


class _Exact:
    """Exact steps of placements on the pipelines they touch, while a task budget lasts."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        self.budget = self.left = exact_budget(3 * sum(len(r) for r in job.routes))
        self.known: dict[Layout, float] = {}  # group (canonical, see independent_parts) -> its step
        self.first_cost: tuple[Placement, int] | None = None  # `unchecked`'s last answer

    def groups(self, placement: Placement) -> set[Layout]:
        """The groups of pipelines sharing no node (canonical, see `independent_parts`) that make up
        the step of `placement` on the pipelines it touches and one untouched pipeline. A partial
        placement leaves out the micro-batches with a lost hop it does not place yet."""
        job = self.job
        touched = {job.base.pipeline_of[m] for m, _ in placement} | {job.home[n][0] for n in placement.values()}
        spare = next((p for p in job.pipes if p not in touched), None)  # stands for the untouched ones
        keep = sorted(touched | ({spare} if spare is not None else set()))
        mbs = [m for p in keep for m in range(job.first_mb[p], job.first_mb[p] + job.count[p])]
        routes, pipes = [], []
        for m in mbs:
            if m not in job.lost_mbs:  # nothing to place or leave out
                routes.append(tuple(job.routes[m]))
                pipes.append(job.base.pipeline_of[m])
                continue
            route = list(job.routes[m])
            for h in range(len(route)):
                if (m, h) in placement:
                    route[h] = (route[h][0], placement[(m, h)])
                elif (m, h) in job.lost_set:
                    break
            else:
                routes.append(tuple(route))
                pipes.append(job.base.pipeline_of[m])
        return set(independent_parts(job.base.with_routes(routes, pipes)))

    def cost(self, groups: set[Layout]) -> int:
        """List-schedule tasks of the groups not scheduled yet in this plan."""
        return 3 * sum(len(r) for part in groups if part not in self.known for r in part.routes)

    def length(self, placement: Placement, keep: int = 0) -> float | None:
        """The step (inf if it cannot be scheduled); None once the budget (less `keep`, kept for a
        later check) is spent. Each group is scheduled once per plan: a move of one hop
        re-schedules only the group it changes."""
        groups = self.groups(placement)
        cost = self.cost(groups)
        if cost > self.left - keep:
            if not keep:
                self.left = 0
            return None
        self.left -= cost
        for part in groups:
            if part not in self.known:
                try:
                    self.known[part] = schedule_length(part, self.job.schedule, self.job.durations)
                except ScheduleError:
                    self.known[part] = float("inf")
        return max((self.known[part] for part in groups), default=0.0) + self.job.join_tail(placement)

    def unchecked(self, first: Placement) -> bool:
        """Checking `first` alone would take over half the budget: nothing could be compared with
        it, so it is the plan unchecked (from about 64 nodes of pp = 8)."""
        if self.first_cost is None or self.first_cost[0] is not first:
            self.first_cost = (first, self.cost(self.groups(first)))
        return self.first_cost[1] > self.budget // 2

    def best(self, candidates: list[Placement]) -> Placement:
        """The shortest of: the candidates, a greedy build by exact steps (each lost hop in turn on
        the option that makes the partial plan's step shortest, twice over, as the schedule-search
        spill did), and each of these improved by single-hop moves (`improve`), best start first,
        while the budget lasts. Without budget: the first candidate, also when checking it alone
        would take more than half the budget (nothing would be left to compare it with)."""
        if self.unchecked(candidates[0]):
            return candidates[0]
        starts: list[tuple[float, int, Placement]] = []
        for k, placement in enumerate(candidates):
            length = self.length(placement)
            if length is None:
                break
            starts.append((length, k, placement))
        if not starts or min(starts, key=lambda t: t[0])[0] == float("inf"):
            return candidates[0]
        built = self.build(candidates, min(starts, key=lambda t: (t[0], t[1]))[2])
        if built is not None:
            starts.append((built[0], len(candidates), built[1]))
        starts.sort(key=lambda t: (t[0], t[1]))
        best_length, _, best = starts[0]
        for length, _, placement in starts:
            if self.left <= 0 or length == float("inf"):
                break
            length, placement = self.improve(length, placement, candidates)
            if length < best_length - 1e-9:
                best_length, best = length, placement
        return best

    def options(self, m: int, h: int, candidates: list[Placement], load: dict[int, float]) -> list[int]:
        """Hosts worth trying for a lost hop, most promising first: where a candidate put it, the
        route's neighbours, the stage's surviving peers, then every survivor, least loaded first."""
        job = self.job
        stage = job.routes[m][h][0]
        by_load = sorted(job.survivors, key=lambda n: (load[n], n))
        hosts = [c[(m, h)] for c in candidates] + job.neighbours(m, h) + job.stage_nodes[stage] + by_load
        return list(dict.fromkeys(hosts))

    def build(self, candidates: list[Placement], fallback: Placement) -> tuple[float, Placement] | None:
        """The schedule-search spill's greedy (`bench/_spill_baseline.py`), on grouped exact steps:
        each lost hop, in micro-batch order, on the same-stage peer or least-loaded survivor that
        makes the partial plan's step shortest (micro-batches with a hop not placed yet left out;
        ties: a peer, a node on the route, the lowest id), twice over (the second pass may move a
        hop again). Where the budget runs short (a full plan's check kept in reserve), the hops not
        placed yet keep `fallback`'s hosts; None when even that cannot be checked."""
        job = self.job
        load = dict(job.load)
        placement: Placement = {}
        length: float | None = None
        reserve = 3 * sum(len(r) for r in job.routes)
        for _ in range(2):
            for m, h in job.lost:
                stage = job.routes[m][h][0]
                if (m, h) in placement:
                    load[placement.pop((m, h))] -= job.cost[stage]
                least = min(load.values())
                peers = job.stage_nodes[stage]
                on_route = {n for k, (_, n) in enumerate(job.routes[m]) if (m, k) not in job.lost_set}
                on_route |= {n for (mm, _), n in placement.items() if mm == m}
                chosen: tuple | None = None
                for node in job.survivors:
                    if load[node] > least + 1e-9 and node not in peers:
                        continue
                    found = self.length({**placement, (m, h): node}, keep=reserve)
                    if found is None:
                        if chosen is not None:
                            placement[(m, h)] = chosen[1]
                        return self._finish(placement, fallback)
                    rank = (round(found, 9), node not in peers, node not in on_route, node)
                    if chosen is None or rank < chosen[0]:
                        chosen = (rank, node, found)
                assert chosen is not None
                placement[(m, h)] = chosen[1]
                load[chosen[1]] += job.cost[stage]
                length = chosen[2]
        assert length is not None
        return length, placement

    def _finish(self, placement: Placement, fallback: Placement) -> tuple[float, Placement] | None:
        """`placement` completed with `fallback`'s hosts, and its step (None without budget)."""
        whole = {**fallback, **placement}
        length = self.length(whole)
        return None if length is None else (length, whole)

    def improve(self, length: float, placement: Placement, candidates: list[Placement]) -> tuple[float, Placement]:
        """Each lost hop moved to the first option (`options`) that shortens the step, in two passes
        (earlier moves change what later hops should do); stops where the budget ends."""
        job = self.job
        placement = dict(placement)
        load = dict(job.load)
        for (m, h), node in placement.items():
            load[node] += job.cost[job.routes[m][h][0]]
        for _ in range(2):
            for m, h in job.lost:
                for node in self.options(m, h, candidates, load):
                    if node == placement[(m, h)]:
                        continue
                    trial = {**placement, (m, h): node}
                    found = self.length(trial)
                    if found is None:
                        return length, placement
                    if found < length - 1e-9:
                        cost = job.cost[job.routes[m][h][0]]
                        load[placement[(m, h)]] -= cost
                        load[node] += cost
                        length, placement = found, trial
        return length, placement
