"""Schedules as data: a pure function from a layout to per-node action lists.

`build_schedule(layout)` returns `{node: [Action, ...]}`. The executor runs these lists; the
simulator replays the very same lists with per-action durations (`simulate`). Nothing here starts a
process or touches torch.distributed.

How lists are made: every micro-batch contributes, per hop of its route, a forward (F) and either a
fused backward (B, schedule `1f1b`) or a backward-input (I) on the critical path plus a deferrable
backward-weight (W, schedule `fiw`). A list scheduler replays the layout in (estimated) time: each
node, whenever idle, starts the ready task with the best priority (backward-input, then forward,
then weight, then bamboo's redundant forward), never holding more micro-batches in flight than its
1F1B warm-up allows. Because the per-node orders come from one consistent timeline, executing them
with blocking receives and non-blocking sends cannot deadlock; `validate_schedule` re-checks that by
replaying the lists. Communication actions are inserted around the compute they feed, gradient
all-reduces right after a node's last backward touching the layers, optimizer steps at the end (so a
node never blocks on a peer while it still has work others wait for).
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from runtime.config import LayoutError
from runtime.parallel.layout import Layout

FORWARD = "F"
BACKWARD = "B"  # fused backward: input and weight gradients
BACKWARD_INPUT = "I"
BACKWARD_WEIGHT = "W"
REDUNDANT_FORWARD = "RF"  # bamboo: forward of a replicated successor stage, in a bubble
SEND_ACT = "SEND_F"
RECV_ACT = "RECV_F"
SEND_GRAD = "SEND_B"
RECV_GRAD = "RECV_B"
ALL_REDUCE = "ALLREDUCE"
OPTIMIZER = "OPT"

COMPUTE = frozenset({FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, REDUNDANT_FORWARD})
SENDS = frozenset({SEND_ACT, SEND_GRAD})
RECVS = frozenset({RECV_ACT, RECV_GRAD})


class ScheduleError(ValueError):
    """A schedule that is incomplete, inconsistent or would deadlock."""


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one node's list. Fields that do not apply are -1 / empty."""

    kind: str
    """F, B, I, W, RF, SEND_F, RECV_F, SEND_B, RECV_B, ALLREDUCE or OPT."""
    stage: int = -1
    """Stage id (layout.stages) the action computes, sends from or receives into."""
    microbatch: int = -1
    """Global micro-batch index."""
    peer: int = -1
    """The other node of a send or receive."""
    pipeline: int = -1
    """Pipeline of the micro-batch (printing and statistics)."""
    layers: tuple[int, int] = (0, 0)
    """ALLREDUCE/OPT: the `[lo, hi)` layer run whose gradients are reduced / stepped."""
    group: tuple[int, ...] = ()
    """ALLREDUCE/OPT: the nodes holding that layer run (the all-reduce members)."""

    def __str__(self) -> str:
        if self.kind in (ALL_REDUCE, OPTIMIZER):
            return f"{self.kind}[{self.layers[0]}:{self.layers[1]}]"
        peer = f"@{self.peer}" if self.peer >= 0 else ""
        return f"{self.kind}{self.microbatch}s{self.stage}{peer}"


Durations = dict[int, tuple[float, float, float]]
"""Stage id -> (forward, backward-input, backward-weight) duration of one micro-batch."""


def stage_durations(layout: Layout, layer_costs: list[tuple[float, float, float]] | None = None) -> Durations:
    """Per-stage (F, I, W) durations from per-layer costs (default: every layer costs 1, 1, 1)."""
    costs = layer_costs or [(1.0, 1.0, 1.0)] * layout.num_layers
    out = {}
    for stage, (lo, hi) in enumerate(layout.stages):
        out[stage] = tuple(sum(c[k] for c in costs[lo:hi]) for k in range(3))  # type: ignore[assignment]
    return out


@dataclass(slots=True)
class _Task:
    kind: str
    mb: int
    hop: int
    node: int
    deps: list[int]  # indices (in the task list) of the tasks that must finish first
    priority: int
    duration: float
    first_on_node: bool  # F of the first hop of this micro-batch on this node (counts as in flight)
    releases: bool  # this backward ends the micro-batch's stay on the node


_PRIORITY = {BACKWARD_INPUT: 0, BACKWARD: 0, FORWARD: 1, BACKWARD_WEIGHT: 2, REDUNDANT_FORWARD: 3}


def _make_tasks(layout: Layout, kind: str, durations: Durations) -> list[_Task]:
    split = kind == "fiw"
    replicas = defaultdict(set)
    for stage, node in layout.replicas:
        replicas[node].add(stage)
    tasks: list[_Task] = []

    def add(task: _Task) -> int:
        tasks.append(task)
        return len(tasks) - 1

    for m, route in enumerate(layout.routes):
        last = len(route) - 1
        first_hop_on: dict[int, int] = {}
        for h, (_, node) in enumerate(route):
            first_hop_on.setdefault(node, h)
        fwd: list[int] = []
        for h, (stage, node) in enumerate(route):
            deps = [fwd[-1]] if h else []
            fwd.append(add(_Task(FORWARD, m, h, node, deps, 1, durations[stage][0], first_hop_on[node] == h, False)))
        downstream = -1  # the next hop's backward (input gradient), which this hop's backward needs
        for h in range(last, -1, -1):
            stage, node = route[h]
            _, i, w = durations[stage]
            deps = [fwd[h]] if downstream < 0 else [fwd[h], downstream]
            first = first_hop_on[node] == h
            if split and h > 0:
                downstream = add(_Task(BACKWARD_INPUT, m, h, node, deps, 0, i, False, first))
                add(_Task(BACKWARD_WEIGHT, m, h, node, [downstream], 2, w, False, False))
            else:
                # The first hop has no input gradient to hurry, so it always runs fused.
                downstream = add(_Task(BACKWARD, m, h, node, deps, 0, i + w, False, first))
        for h, (_, node) in enumerate(route):
            # bamboo: the node holding the next hop's stage as a replica runs its forward eagerly.
            succ_stage, succ_node = route[(h + 1) % len(route)]
            if len(route) > 1 and succ_stage in replicas[node] and succ_node != node:
                deps = [fwd[h]] if h < last else []
                add(_Task(REDUNDANT_FORWARD, m, h, node, deps, 3, durations[succ_stage][0], False, False))
    return tasks


def _in_flight_caps(layout: Layout) -> dict[tuple[int, int], int]:
    """1F1B memory bound per (node, pipeline): micro-batches of that pipeline the node may hold
    (route length - first hop index). Per pipeline, so a node that also serves re-routed
    micro-batches of another pipeline (recycle) can keep both pipelines' warm-ups going."""
    caps: dict[tuple[int, int], int] = defaultdict(int)
    for route, pipe in zip(layout.routes, layout.pipeline_of, strict=True):
        seen = set()
        for h, (_, node) in enumerate(route):
            if node not in seen:
                seen.add(node)
                caps[(node, pipe)] = max(caps[(node, pipe)], len(route) - h)
    return caps


def _list_schedule(layout: Layout, kind: str, durations: Durations) -> dict[int, list[tuple[float, _Task]]]:
    """Replay the layout in estimated time: repeatedly start, over all nodes, the ready task with the
    smallest (start, priority, micro-batch, hop, node), start = max(inputs ready, node free).

    A pick costs O(log tasks), not a scan of every ready task: each node keeps two heaps, tasks whose
    inputs are ready by the time the node is free (`avail`: they all start then, so they rank by
    (priority, mb, hop) alone) and the others (`pend`, by inputs-ready time first; a node's free time
    only grows, so tasks only move from pend to avail), and a global heap holds each node's best
    (re-offered whenever it may have changed; stale entries are skipped when popped). A forward held
    back by a full memory cap waits aside until a backward on that (node, pipeline) releases one.
    `tests/runtime/test_list_schedule.py` checks the result is the scan's, pick for pick.
    """
    tasks = _make_tasks(layout, kind, durations)
    n = len(tasks)
    # (priority, mb, hop) is unique per node: one integer orders it.
    hops = max((len(r) for r in layout.routes), default=1)
    mbs = max(len(layout.routes), 1)
    order_key = [(t.priority * mbs + t.mb) * hops + t.hop for t in tasks]
    node_of = [t.node for t in tasks]
    duration = [t.duration for t in tasks]
    # (node, pipeline) memory slots numbered, so the hot loop indexes lists instead of hashing tuples.
    slot_ids: dict[tuple[int, int], int] = {}
    slot_of = [slot_ids.setdefault((t.node, layout.pipeline_of[t.mb]), len(slot_ids)) for t in tasks]
    by_slot = _in_flight_caps(layout)
    caps = [by_slot[slot] for slot in slot_ids]
    needs_slot = [t.first_on_node for t in tasks]  # only a micro-batch's first forward on a node takes memory
    delta = [int(t.first_on_node) - int(t.releases) for t in tasks]
    waiting = [len(t.deps) for t in tasks]
    dependents: list[list[int]] = [[] for _ in range(n)]
    deps_of = [t.deps for t in tasks]
    for i, deps in enumerate(deps_of):
        for d in deps:
            dependents[d].append(i)
    finish = [0.0] * n
    in_flight = [0] * len(slot_ids)
    held: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    nodes = sorted(set(node_of))
    free = dict.fromkeys(nodes, 0.0)
    avail: dict[int, list[tuple[int, int, float]]] = {v: [] for v in nodes}  # (order key, task, ready at)
    pend: dict[int, list[tuple[float, int, int]]] = {v: [] for v in nodes}  # (ready at, order key, task)
    heappush, heappop = heapq.heappush, heapq.heappop

    def best(node: int) -> tuple[float, int, int] | None:
        """(start, order key, task) this node would start next, or None."""
        av, pe, now = avail[node], pend[node], free[node]
        while pe and pe[0][0] <= now:
            ready_at, key, i = heappop(pe)
            heappush(av, (key, i, ready_at))
        while av:
            key, i, ready_at = av[0]
            if not needs_slot[i] or in_flight[slot_of[i]] < caps[slot_of[i]]:
                return (now, key, i)
            heappop(av)
            held[slot_of[i]].append((ready_at, key, i))
        while pe:
            ready_at, key, i = pe[0]
            if not needs_slot[i] or in_flight[slot_of[i]] < caps[slot_of[i]]:
                return (ready_at, key, i)
            heappop(pe)
            held[slot_of[i]].append((ready_at, key, i))
        return None

    picks: list[tuple[float, int, int, int]] = []  # (start, order key, node, task)

    def offer(node: int) -> None:
        b = best(node)
        if b is not None:
            heappush(picks, (b[0], b[1], node, b[2]))

    for i in range(n):
        if not waiting[i]:
            heappush(pend[node_of[i]], (0.0, order_key[i], i))
    for node in nodes:
        offer(node)
    order: dict[int, list[tuple[float, _Task]]] = defaultdict(list)
    for _ in range(n):
        while True:
            if not picks:
                raise ScheduleError("no task can start: the layout's routes form a cycle or a node's memory cap is 0")
            start, key, node, i = heappop(picks)
            if best(node) == (start, key, i):
                break
        av = avail[node]
        if av and av[0][1] == i:
            heappop(av)
        else:
            heappop(pend[node])
        end = finish[i] = free[node] = start + duration[i]
        slot = slot_of[i]
        in_flight[slot] += delta[i]
        if delta[i] < 0 and slot in held:
            for ready_at, k, j in held.pop(slot):
                heappush(pend[node], (ready_at, k, j))
        order[node].append((start, tasks[i]))
        for child in dependents[i]:
            waiting[child] -= 1
            if not waiting[child]:
                other = node_of[child]
                ready_at = end
                for d in deps_of[child]:
                    if finish[d] > ready_at:
                        ready_at = finish[d]
                heappush(pend[other], (ready_at, order_key[child], child))
                if other != node:
                    offer(other)
        offer(node)
    return order


def independent_parts(layout: Layout) -> list[Layout]:
    """The layout split into groups of micro-batches that share no node, each relabelled canonically
    (nodes, micro-batches and pipelines numbered in order of first appearance), so two groups with the
    same shape compare equal. The list scheduler treats such groups independently (a pick in one
    never changes another's state, and ties never depend on a node id: a (micro-batch, hop) has one
    node), so a step is as long as its longest group and equal groups need scheduling once."""
    parent: dict[int, int] = {}

    def root(v: int) -> int:
        while parent.setdefault(v, v) != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for route in layout.routes:
        first = root(route[0][1]) if route else -1
        for _, node in route[1:]:
            other = root(node)
            if other != first:
                parent[other] = first
    groups: dict[int, list[int]] = defaultdict(list)
    for m, route in enumerate(layout.routes):
        if route:
            groups[root(route[0][1])].append(m)
    replicas_by_node: dict[int, list[int]] = defaultdict(list)
    for stage, node in layout.replicas:
        replicas_by_node[node].append(stage)
    parts = []
    for mbs in groups.values():
        names: dict[int, int] = {}
        pipes: dict[int, int] = {}
        routes = tuple(tuple((s, names.setdefault(n, len(names))) for s, n in layout.routes[m]) for m in mbs)
        pipeline_of = tuple(pipes.setdefault(layout.pipeline_of[m], len(pipes)) for m in mbs)
        replicas = tuple(sorted((s, names[n]) for n in names for s in replicas_by_node.get(n, ())))
        parts.append(
            Layout(
                num_layers=layout.num_layers,
                stages=layout.stages,
                routes=routes,
                pipeline_of=pipeline_of,
                microbatch_size=layout.microbatch_size,
                replicas=replicas,
            )
        )
    return parts


def schedule_length(layout: Layout, kind: str = "1f1b", durations: Durations | None = None) -> float:
    """Length of one step of `layout` as `build_schedule` orders it (communication free), without
    building the action lists: the longest of its independent groups (`independent_parts`), each
    distinct group scheduled once, so a fleet of identical pipelines costs one pipeline's schedule."""
    durations = durations or stage_durations(layout)
    lengths = {}
    for part in independent_parts(layout):
        if part not in lengths:
            order = _list_schedule(part, kind, durations)
            lengths[part] = max((start + task.duration for row in order.values() for start, task in row), default=0.0)
    return max(lengths.values(), default=0.0)


def build_schedule(layout: Layout, kind: str = "1f1b", durations: Durations | None = None) -> dict[int, list[Action]]:
    """Per-node action lists for one training step of `layout`.

    `kind` is `1f1b` (fused backward) or `fiw` (backward-input on the critical path, backward-weight
    deferred into bubbles). `durations` (stage -> F, I, W) steer the order; default unit costs per layer.
    """
    return {node: [Action(*row) for row in rows] for node, rows in schedule_rows(layout, kind, durations).items()}


Row = tuple[str, int, int, int, int, tuple[int, int], tuple[int, ...]]
"""An action as a plain tuple, fields in `Action`'s order (kind, stage, microbatch, peer, pipeline,
layers, group): what `replay_end` reads, `Action(*row)` what the executor runs."""


def schedule_rows(layout: Layout, kind: str = "1f1b", durations: Durations | None = None) -> dict[int, list[Row]]:
    """`build_schedule`'s lists as `Row` tuples (the simulator replays tens of thousands of actions
    per coupled group; a frozen dataclass costs about 0.5 us each to build, a tuple almost nothing)."""
    if kind not in ("1f1b", "fiw"):
        raise LayoutError(f"schedule {kind!r} is unknown; expected '1f1b' or 'fiw'")
    layout.validate()
    durations = durations or stage_durations(layout)
    order = _list_schedule(layout, kind, durations)
    runs = [(lo, hi, owners) for lo, hi, owners in layout.owner_runs() if owners]
    run_members = [frozenset(owners) for _, _, owners in runs]
    # The runs a backward of (node, stage) touches, found once per pair (a thousand-node group has
    # tens of thousands of backwards and few pairs).
    touched: dict[tuple[int, int], tuple[int, ...]] = {}
    stages, routes, pipeline_of = layout.stages, layout.routes, layout.pipeline_of
    none = (0, 0)
    out: dict[int, list[Row]] = {}
    for node in layout.nodes():
        acts: list[Row] = []
        append = acts.append
        grad_touch: dict[int, int] = {}  # run index -> position after the node's last backward touching it
        for _, task in order.get(node, ()):
            tkind, mb, hop = task.kind, task.mb, task.hop
            route = routes[mb]
            stage = route[hop][0]
            pipe = pipeline_of[mb]
            prev_node = route[hop - 1][1] if hop else -1
            next_node = route[hop + 1][1] if hop + 1 < len(route) else -1
            if tkind == FORWARD:
                if hop and prev_node != node:
                    append((RECV_ACT, stage, mb, prev_node, pipe, none, ()))
                append((FORWARD, stage, mb, -1, pipe, none, ()))
                if next_node >= 0 and next_node != node:
                    append((SEND_ACT, stage, mb, next_node, pipe, none, ()))
            elif tkind in (BACKWARD, BACKWARD_INPUT):
                if next_node >= 0 and next_node != node:
                    append((RECV_GRAD, stage, mb, next_node, pipe, none, ()))
                append((tkind, stage, mb, -1, pipe, none, ()))
                if hop and prev_node != node:
                    append((SEND_GRAD, stage, mb, prev_node, pipe, none, ()))
            elif tkind == REDUNDANT_FORWARD:
                succ_stage = route[(hop + 1) % len(route)][0]
                append((REDUNDANT_FORWARD, succ_stage, mb, -1, pipe, none, ()))
            else:
                append((tkind, stage, mb, -1, pipe, none, ()))
            if tkind in (BACKWARD, BACKWARD_WEIGHT):
                hit = touched.get((node, stage))
                if hit is None:
                    lo, hi = stages[stage]
                    hit = touched[(node, stage)] = tuple(
                        r for r, (rlo, rhi, _) in enumerate(runs) if node in run_members[r] and rlo < hi and lo < rhi
                    )
                for r in hit:
                    grad_touch[r] = len(acts)
        # Insert all-reduces after the last backward touching each run (replica-only runs: at the end).
        inserts: dict[int, list[Row]] = defaultdict(list)
        issued = []
        for r, (lo, hi, owners) in enumerate(runs):
            if node in run_members[r]:
                at = grad_touch.get(r, len(acts))
                inserts[at].append((ALL_REDUCE, -1, -1, -1, -1, (lo, hi), owners))
                issued.append((at, r))
        merged: list[Row] = []
        done = 0
        for pos in sorted(inserts):  # a few positions: copy the slices between them
            merged.extend(acts[done:pos])
            merged.extend(inserts[pos])
            done = pos
        merged.extend(acts[done:])
        for _, r in sorted(issued):
            lo, hi, owners = runs[r]
            merged.append((OPTIMIZER, -1, -1, -1, -1, (lo, hi), owners))
        out[node] = merged
    return out


def forward_schedule(layout: Layout) -> dict[int, list[Action]]:
    """Per-node action lists of a forward-only pass over `layout`'s routes (validation: no backward,
    no all-reduce, no optimizer). Every node runs its hops in (micro-batch, hop) order, one order
    shared by all nodes, so blocking receives and non-blocking sends cannot deadlock."""
    layout.validate()
    out: dict[int, list[Action]] = {node: [] for node in layout.nodes()}
    for mb, route in enumerate(layout.routes):
        pipe = layout.pipeline_of[mb]
        for hop, (stage, node) in enumerate(route):
            prev_node = route[hop - 1][1] if hop else -1
            next_node = route[hop + 1][1] if hop + 1 < len(route) else -1
            if hop and prev_node != node:
                out[node].append(Action(RECV_ACT, stage, mb, prev_node, pipe))
            out[node].append(Action(FORWARD, stage, mb, -1, pipe))
            if next_node >= 0 and next_node != node:
                out[node].append(Action(SEND_ACT, stage, mb, next_node, pipe))
    return out


def action_duration(layout: Layout, durations: Durations | None = None) -> Callable[[Action], float]:
    """Duration of each action from per-stage (F, I, W) durations; communication counts as 0."""
    durations = durations or stage_durations(layout)

    def duration(act: Action) -> float:
        if act.kind not in COMPUTE:
            return 0.0
        f, i, w = durations[act.stage]
        return {FORWARD: f, REDUNDANT_FORWARD: f, BACKWARD_INPUT: i, BACKWARD_WEIGHT: w, BACKWARD: i + w}[act.kind]

    return duration


def simulate(
    schedule: dict[int, list[Action]],
    duration: Callable[[Action], float] = lambda a: 1.0 if a.kind in COMPUTE else 0.0,
    *,
    allreduce_time: float = 0.0,
    send_latency: float = 0.0,
) -> dict[int, list[tuple[float, float, Action]]]:
    """Replay the lists: blocking receives, non-blocking sends, all-reduce completes when its last
    member issues it, OPT waits for its all-reduce; a message arrives `send_latency` after its send.
    Returns per node (start, end, action).

    Raises `ScheduleError` on a deadlock or an unmatched send/receive. This is the reference
    semantics the executor implements and the simulator scales up.
    """
    pos = dict.fromkeys(schedule, 0)
    clock = dict.fromkeys(schedule, 0.0)
    timeline: dict[int, list[tuple[float, float, Action]]] = {n: [] for n in schedule}
    sent: dict[tuple, deque[float]] = defaultdict(deque)
    issued: dict[tuple, dict[int, float]] = defaultdict(dict)
    # Min-heap on each node's clock keeps the replay causal.
    progress = True
    while progress:
        progress = False
        heap = [(clock[n], n) for n in schedule if pos[n] < len(schedule[n])]
        heapq.heapify(heap)
        while heap:
            _, node = heapq.heappop(heap)
            while pos[node] < len(schedule[node]):
                act = schedule[node][pos[node]]
                start = clock[node]
                if act.kind in SENDS:
                    direction = "f" if act.kind == SEND_ACT else "b"
                    sent[(direction, act.microbatch, node, act.peer)].append(start)
                elif act.kind in RECVS:
                    direction = "f" if act.kind == RECV_ACT else "b"
                    queue = sent.get((direction, act.microbatch, act.peer, node))
                    if not queue:
                        break
                    start = max(start, queue.popleft() + send_latency)
                elif act.kind == ALL_REDUCE:
                    issued[(act.layers, act.group)][node] = start
                elif act.kind == OPTIMIZER:
                    members = issued.get((act.layers, act.group), {})
                    if len(members) < len(act.group):
                        break
                    start = max(start, max(members.values()) + allreduce_time)
                end = start + duration(act)
                timeline[node].append((start, end, act))
                clock[node] = end
                pos[node] += 1
                progress = True
    stuck = {n: str(schedule[n][pos[n]]) for n in schedule if pos[n] < len(schedule[n])}
    if stuck:
        raise ScheduleError(f"schedule deadlocks; blocked nodes and their next action: {stuck}")
    leftovers = {k: len(v) for k, v in sent.items() if v}
    if leftovers:
        raise ScheduleError(f"sends without a matching receive (direction, mb, src, dst): {leftovers}")
    return timeline


def replay_end(
    rows: dict[int, list[Row]],
    stage_price: dict[str, list[float]],
    group_price: Callable[[Row], float],
    *,
    allreduce_time: float = 0.0,
    send_latency: float = 0.0,
) -> float:
    """When the last action of `schedule_rows`' lists ends: `simulate`'s replay (same rules, same
    arithmetic, so the same float) without building a timeline. A row's duration is
    `stage_price[kind][stage]`, or `group_price(row)` for ALLREDUCE and OPT. The simulator calls
    this for every coupled group; `tests/runtime/test_replay.py` checks it against `simulate`."""
    nodes = list(rows)
    pos = dict.fromkeys(nodes, 0)
    clock = dict.fromkeys(nodes, 0.0)
    sent: dict[tuple, deque[float]] = defaultdict(deque)
    issued: dict[tuple, dict[int, float]] = defaultdict(dict)
    last = 0.0
    progress = True
    while progress:
        progress = False
        heap = [(clock[n], n) for n in nodes if pos[n] < len(rows[n])]
        heapq.heapify(heap)
        while heap:
            _, node = heapq.heappop(heap)
            acts = rows[node]
            p, now, count = pos[node], clock[node], len(acts)
            first = p
            while p < count:
                act = acts[p]
                kind = act[0]
                start = now
                if kind in (SEND_ACT, SEND_GRAD):
                    sent[(kind == SEND_ACT, act[2], node, act[3])].append(start)
                elif kind in (RECV_ACT, RECV_GRAD):
                    queue = sent.get((kind == RECV_ACT, act[2], act[3], node))
                    if not queue:
                        break
                    ready = queue.popleft() + send_latency
                    if ready > start:
                        start = ready
                elif kind == ALL_REDUCE:
                    issued[(act[5], act[6])][node] = start
                    now = start + group_price(act)
                    p += 1
                    continue
                elif kind == OPTIMIZER:
                    members = issued.get((act[5], act[6]))
                    if members is None or len(members) < len(act[6]):
                        break
                    ready = max(members.values()) + allreduce_time
                    if ready > start:
                        start = ready
                    now = start + group_price(act)
                    p += 1
                    continue
                now = start + stage_price[kind][act[1]]
                p += 1
            if p > first:
                progress = True
                pos[node], clock[node] = p, now
                if now > last:
                    last = now
    stuck = {n: str(Action(*rows[n][pos[n]])) for n in nodes if pos[n] < len(rows[n])}
    if stuck:
        raise ScheduleError(f"schedule deadlocks; blocked nodes and their next action: {stuck}")
    leftovers = {k: len(v) for k, v in sent.items() if v}
    if leftovers:
        raise ScheduleError(f"sends without a matching receive (forward, mb, src, dst): {leftovers}")
    return last


def validate_schedule(layout: Layout, schedule: dict[int, list[Action]], kind: str = "1f1b") -> None:
    """Check that every (micro-batch, hop) is computed exactly once by the right node and that the
    lists replay without deadlock. Raises `ScheduleError` naming what is wrong."""
    expected: dict[tuple[str, int, int], int] = {}
    for m, route in enumerate(layout.routes):
        for h, (stage, node) in enumerate(route):
            expected[(FORWARD, m, stage)] = node
            if kind == "fiw" and h > 0:
                expected[(BACKWARD_INPUT, m, stage)] = node
                expected[(BACKWARD_WEIGHT, m, stage)] = node
            else:
                expected[(BACKWARD, m, stage)] = node
    seen: dict[tuple[str, int, int], int] = {}
    for node, acts in schedule.items():
        for act in acts:
            if act.kind in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT):
                key = (act.kind, act.microbatch, act.stage)
                if key in seen:
                    raise ScheduleError(f"{act} appears twice (nodes {seen[key]} and {node})")
                if expected.get(key) != node:
                    raise ScheduleError(f"{act} runs on node {node}; expected node {expected.get(key)}")
                seen[key] = node
    missing = sorted(set(expected) - set(seen))
    if missing:
        raise ScheduleError(f"{len(missing)} actions missing, e.g. {missing[:3]} (kind, micro-batch, stage)")
    simulate(schedule)


def format_grid(
    schedule: dict[int, list[Action]],
    duration: Callable[[Action], float] = lambda a: 1.0 if a.kind in COMPUTE else 0.0,
    *,
    cell: float | None = None,
) -> str:
    """The schedule as a text grid: one row per node, one column per time unit, `.` = idle."""
    timeline = simulate(schedule, duration)
    spans = [(s, e, a) for row in timeline.values() for s, e, a in row if a.kind in COMPUTE and e > s]
    if not spans:
        return "(empty schedule)"
    unit = cell or min(e - s for s, e, _ in spans)
    end = max(e for _, e, _ in spans)
    width = round(end / unit)
    labels = {FORWARD: "F", BACKWARD: "B", BACKWARD_INPUT: "I", BACKWARD_WEIGHT: "W", REDUNDANT_FORWARD: "r"}
    lines = ["node | " + " ".join(f"{t:<4}" for t in range(width))]
    for node in sorted(timeline):
        cells = ["."] * width
        for s, e, a in timeline[node]:
            if a.kind not in COMPUTE:
                continue
            for t in range(round(s / unit), max(round(e / unit), round(s / unit) + 1)):
                if t < width:
                    cells[t] = f"{labels[a.kind]}{a.microbatch}"
        lines.append(f"{node:>4} | " + " ".join(f"{c:<4}" for c in cells))
    return "\n".join(lines)
