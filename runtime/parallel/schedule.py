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

import functools
import heapq
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Hop, Layout

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


def stated_layer_times(config: JobConfig) -> tuple[list[tuple[float, float, float]], float] | None:
    """Each layer's (F, I, W) for one micro-batch in the unit the job states them in, and that unit
    in seconds: the emulated `device_time` (ms), else `layer_costs` (seconds of forward + backward,
    split evenly over F, I and W); None when the job states neither."""
    dt = config.device_time
    if dt is not None:
        return [(dt.forward_ms, dt.backward_input_ms, dt.backward_weight_ms)] * config.model.num_layers, 1e-3
    if config.layer_costs:
        return [(c / 3, c / 3, c / 3) for c in config.layer_costs], 1.0
    return None


def job_durations(config: JobConfig, layout: Layout) -> Durations:
    """Stage -> (F, I, W) that every node of the job builds its action lists with (unit costs when
    the job states no times). Whoever predicts the schedule the nodes will run (recycle's spill
    placement, the trainer's step estimate) must use these very numbers: the list scheduler breaks
    ties by them, so the same times in another unit (seconds for milliseconds) can order a
    different schedule, 152 ms instead of 136 ms in `bench runtime`'s 1-of-8 spill layout."""
    stated = stated_layer_times(config)
    return stage_durations(layout, stated[0] if stated else None)


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
_KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, REDUNDANT_FORWARD)
_RECV = {FORWARD: RECV_ACT, BACKWARD: RECV_GRAD, BACKWARD_INPUT: RECV_GRAD}  # what a task's input arrives as
_SEND = {FORWARD: SEND_ACT, BACKWARD: SEND_GRAD, BACKWARD_INPUT: SEND_GRAD}  # what its output leaves as


@dataclass(slots=True)
class _RouteTasks:
    """The tasks of one micro-batch on a route of a given shape (stages, which hops share a node,
    where bamboo's redundant forwards run), numbered from 0: F of every hop, the backwards from the
    last hop down, then the redundant forwards. Nodes are local (0, 1, ... in order of first hop),
    links between tasks offsets (other task - this task), so every micro-batch on a route of this
    shape shares it and a layout's tasks are a few list extends (a recycle layout has a few shapes)."""

    kind: list[str]
    hop: list[int]
    node: list[int]  # local node
    stage: list[int]  # the stage the action's row names (RF: the successor's stage)
    duration: list[float]
    key: list[int]  # priority * span + hop: the order key less the micro-batch's part
    waiting: list[int]  # number of dependencies
    deps: list[tuple[int, ...]]  # offsets of the dependencies
    dependents: list[tuple[int, ...]]  # offsets of the tasks that depend on this one
    gate: list[int]  # 1 + local node whose memory a first F needs room in, else 0
    slot: list[int]  # 1 + local node whose memory the task takes or frees, else 0
    delta: list[int]  # +1 takes, -1 frees, 0 neither
    recv: list[int]  # offset of the task whose send this task receives (0: no receive)
    sends: list[bool]  # the task's output goes to another node
    code: list[int]  # the row's (kind, stage) as one integer: `_KINDS` index * stages + stage
    first_hop: list[int]  # local node -> its first hop


def _route_tasks(
    route: tuple[Hop, ...], redundant: tuple[int, ...], split: bool, durations: Durations, span: int, stages: int
) -> _RouteTasks:
    """`route` with local nodes; `redundant`: the hops whose node runs the next hop's forward."""
    last = len(route) - 1
    first_hop_on: dict[int, int] = {}
    for h, (_, node) in enumerate(route):
        first_hop_on.setdefault(node, h)
    rows: list[tuple] = []  # (kind, hop, node, stage, duration, deps, delta, recv, sends)

    def add(row: tuple) -> int:
        rows.append(row)
        return len(rows) - 1

    fwd: list[int] = []
    for h, (stage, node) in enumerate(route):
        recv = fwd[-1] if h > 0 and route[h - 1][1] != node else -1
        deps = (fwd[-1],) if h else ()
        takes = int(first_hop_on[node] == h)
        fwd.append(add((FORWARD, h, node, stage, durations[stage][0], deps, takes, recv,
                        h < last and route[h + 1][1] != node)))
    downstream = -1  # the next hop's backward (input gradient), which this hop's backward needs
    for h in range(last, -1, -1):
        stage, node = route[h]
        _, i, w = durations[stage]
        deps = (fwd[h],) if downstream < 0 else (fwd[h], downstream)
        recv = downstream if h < last and route[h + 1][1] != node else -1
        sends = h > 0 and route[h - 1][1] != node
        frees = -int(first_hop_on[node] == h)
        if split and h > 0:
            downstream = add((BACKWARD_INPUT, h, node, stage, i, deps, frees, recv, sends))
            add((BACKWARD_WEIGHT, h, node, stage, w, (downstream,), 0, -1, False))
        else:
            # The first hop has no input gradient to hurry, so it always runs fused.
            downstream = add((BACKWARD, h, node, stage, i + w, deps, frees, recv, sends))
    for h in redundant:
        succ_stage = route[(h + 1) % len(route)][0]
        deps = (fwd[h],) if h < last else ()
        add((REDUNDANT_FORWARD, h, route[h][1], succ_stage, durations[succ_stage][0], deps, 0, -1, False))
    dependents: list[list[int]] = [[] for _ in rows]
    for j, row in enumerate(rows):
        for d in row[5]:
            dependents[d].append(j - d)
    return _RouteTasks(
        kind=[r[0] for r in rows],
        hop=[r[1] for r in rows],
        node=[r[2] for r in rows],
        stage=[r[3] for r in rows],
        duration=[r[4] for r in rows],
        key=[_PRIORITY[r[0]] * span + r[1] for r in rows],
        waiting=[len(r[5]) for r in rows],
        deps=[tuple(d - j for d in r[5]) for j, r in enumerate(rows)],
        dependents=[tuple(d) for d in dependents],
        gate=[r[2] + 1 if r[6] > 0 else 0 for r in rows],
        slot=[r[2] + 1 if r[6] else 0 for r in rows],
        delta=[r[6] for r in rows],
        recv=[r[7] - j if r[7] >= 0 else 0 for j, r in enumerate(rows)],
        sends=[r[8] for r in rows],
        code=[_KINDS.index(r[0]) * stages + r[3] for r in rows],
        first_hop=sorted(first_hop_on.values()),
    )


@dataclass(slots=True)
class _Tasks:
    """Every task of a layout as parallel lists (index = task id) and, once scheduled, the picks."""

    nodes: list[int]  # dense node index -> node id
    kind: list[str] = field(default_factory=list)
    mb: list[int] = field(default_factory=list)
    hop: list[int] = field(default_factory=list)
    node: list[int] = field(default_factory=list)  # dense node index
    stage: list[int] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    key: list[int] = field(default_factory=list)  # (priority, micro-batch, hop) as one integer
    waiting: list[int] = field(default_factory=list)
    deps: list[tuple[int, ...]] = field(default_factory=list)  # offsets, as in `_RouteTasks`
    dependents: list[tuple[int, ...]] = field(default_factory=list)
    gate: list[int] = field(default_factory=list)  # memory slot a first F must find room in (0: none)
    slot: list[int] = field(default_factory=list)  # memory slot the task takes or frees (0: none)
    delta: list[int] = field(default_factory=list)  # +1 takes, -1 frees, 0 neither
    recv: list[int] = field(default_factory=list)
    sends: list[bool] = field(default_factory=list)
    code: list[int] = field(default_factory=list)
    caps: list[int] = field(default_factory=list)  # memory slot -> micro-batches it may hold
    picked: list[int] = field(default_factory=list)  # task ids in the order the scheduler started them
    start: list[float] = field(default_factory=list)  # task id -> start


def _task_table(layout: Layout, kind: str, durations: Durations) -> _Tasks:
    """The layout's tasks (see `_RouteTasks`) and per-(node, pipeline) memory slots: the 1F1B bound
    of a slot is the micro-batches of that pipeline the node may hold (route length - first hop
    index). Per pipeline, so a node that also serves re-routed micro-batches of another pipeline
    (recycle) can keep both pipelines' warm-ups going. Slot 0 stands for no bound."""
    split = kind == "fiw"
    replicas: dict[int, set[int]] = defaultdict(set)
    for stage, node in layout.replicas:
        replicas[node].add(stage)
    hops = max((len(r) for r in layout.routes), default=1)
    span = max(len(layout.routes), 1) * hops
    # Dense node indices in node order (the scheduler breaks ties by node).
    nodes = sorted({node for route in dict.fromkeys(layout.routes) for _, node in route})
    dense = {node: k for k, node in enumerate(nodes)}
    out = _Tasks(nodes=nodes, caps=[len(layout.routes) + 1])  # slot 0 never fills
    caps = out.caps
    shapes: dict[tuple, _RouteTasks] = {}
    slot_ids: dict[tuple[int, int], int] = {}
    # (route, pipeline) -> its shape's tasks, and their dense nodes and memory slots
    placed: dict[tuple[tuple[Hop, ...], int], tuple[_RouteTasks, list[int], list[int], list[int]]] = {}
    for m, (route, pipe) in enumerate(zip(layout.routes, layout.pipeline_of, strict=True)):
        found = placed.get((route, pipe))
        if found is None:
            local: dict[int, int] = {}
            shape = tuple([(stage, local.setdefault(node, len(local))) for stage, node in route])
            # bamboo: the node holding the next hop's stage as a replica runs its forward eagerly.
            redundant = tuple([
                h for h, (_, node) in enumerate(route)
                if len(route) > 1 and route[(h + 1) % len(route)][0] in replicas.get(node, ())
                and route[(h + 1) % len(route)][1] != node
            ]) if replicas else ()
            t = shapes.get((shape, redundant))
            if t is None:
                t = _route_tasks(shape, redundant, split, durations, span, len(layout.stages))
                shapes[(shape, redundant)] = t
            members = [dense[node] for node in local]
            slots = [0]
            for v, h in zip(members, t.first_hop, strict=True):
                s = slot_ids.setdefault((v, pipe), len(caps))
                if s == len(caps):
                    caps.append(0)
                caps[s] = max(caps[s], len(route) - h)
                slots.append(s)
            found = placed[(route, pipe)] = (
                t, [members[j] for j in t.node], [slots[j] for j in t.gate], [slots[j] for j in t.slot]
            )
        t, node, gate, slot = found
        out.kind += t.kind
        out.mb += [m] * len(t.kind)
        out.hop += t.hop
        out.node += node
        out.stage += t.stage
        out.duration += t.duration
        offset = m * hops
        out.key += [k + offset for k in t.key]
        out.waiting += t.waiting
        out.deps += t.deps
        out.dependents += t.dependents
        out.gate += gate
        out.slot += slot
        out.delta += t.delta
        out.recv += t.recv
        out.sends += t.sends
        out.code += t.code
    return out


def _offer(avail: list, pend: list, free: list[float], gate: list[int], in_flight: list[int], caps: list[int],
           held: dict, offered: list, picks: list, v: int) -> None:
    """Push the (start, order key, node, task) node `v` would start next (if any) on `picks`.

    Each node keeps two heaps: tasks whose inputs are ready by the time the node is free (`avail`:
    they all start then, so they rank by (priority, mb, hop) alone) and the others (`pend`, by
    inputs-ready time first; a node's free time only grows, so tasks only move from pend to
    avail). `picks` holds each node's best, re-offered after every change to the node; an entry
    other than the node's latest offer (`offered`) is stale and skipped when popped. A forward held
    back by a full memory cap waits aside (`held`) until a backward on that (node, pipeline)
    releases one."""
    heappush, heappop = heapq.heappush, heapq.heappop
    av, pe, now = avail[v], pend[v], free[v]
    while pe and pe[0][0] <= now:
        ready_at, key, i = heappop(pe)
        heappush(av, (key, i, ready_at))
    best = None
    while av:
        key, i, ready_at = av[0]
        s = gate[i]
        if in_flight[s] < caps[s]:
            best = (now, key, v, i)
            break
        heappop(av)
        held.setdefault(s, []).append((ready_at, key, i))
    else:
        while pe:
            ready_at, key, i = pe[0]
            s = gate[i]
            if in_flight[s] < caps[s]:
                best = (ready_at, key, v, i)
                break
            heappop(pe)
            held.setdefault(s, []).append((ready_at, key, i))
    offered[v] = best
    if best is not None:
        heappush(picks, best)


def _schedule(layout: Layout, kind: str, durations: Durations) -> _Tasks:
    """Replay the layout in estimated time: repeatedly start, over all nodes, the ready task with the
    smallest (start, priority, micro-batch, hop, node), start = max(inputs ready, node free).

    A pick costs O(log tasks), not a scan of every ready task: per node heaps and a global heap of
    each node's best (`_offer`). `tests/runtime/test_list_schedule.py` checks the result is the
    scan's, pick for pick.
    """
    tasks = _task_table(layout, kind, durations)
    n = len(tasks.kind)
    node_of, duration, key_of = tasks.node, tasks.duration, tasks.key
    slot_of, delta = tasks.slot, tasks.delta
    waiting, dependents = list(tasks.waiting), tasks.dependents
    ready = [0.0] * n  # latest finish among a task's finished dependencies
    start_of = [0.0] * n
    picked = tasks.picked
    count = len(tasks.nodes)
    in_flight = [0] * len(tasks.caps)
    held: dict[int, list[tuple[float, int, int]]] = {}
    free = [0.0] * count
    avail: list[list[tuple[int, int, float]]] = [[] for _ in range(count)]  # (order key, task, ready at)
    pend: list[list[tuple[float, int, int]]] = [[] for _ in range(count)]  # (ready at, order key, task)
    offered: list[tuple[float, int, int, int] | None] = [None] * count  # each node's latest offer
    picks: list[tuple[float, int, int, int]] = []  # (start, order key, node, task)
    heappush, heappop = heapq.heappush, heapq.heappop
    offer = functools.partial(_offer, avail, pend, free, tasks.gate, in_flight, tasks.caps, held, offered, picks)
    for i in range(n):
        if not waiting[i]:
            heappush(pend[node_of[i]], (0.0, key_of[i], i))
    for v in range(count):
        offer(v)
    for _ in range(n):
        while True:
            if not picks:
                raise ScheduleError("no task can start: the layout's routes form a cycle or a node's memory cap is 0")
            entry = heappop(picks)
            if offered[entry[2]] is entry:
                break
        start, _, v, i = entry
        av = avail[v]
        if av and av[0][1] == i:
            heappop(av)
        else:
            heappop(pend[v])
        end = free[v] = start + duration[i]
        start_of[i] = start
        picked.append(i)
        d = delta[i]
        if d:
            s = slot_of[i]
            in_flight[s] += d
            if d < 0 and s in held:
                for ready_at, k, j in held.pop(s):
                    heappush(pend[v], (ready_at, k, j))
        for off in dependents[i]:
            child = i + off
            if end > ready[child]:
                ready[child] = end
            waiting[child] -= 1
            if not waiting[child]:
                other, at, key = node_of[child], ready[child], key_of[child]
                # Straight into avail when the node is free by then (`_offer` would move it there).
                if at <= free[other]:
                    heappush(avail[other], (key, child, at))
                else:
                    heappush(pend[other], (at, key, child))
                if other != v:
                    # The other node's offer stands unless the child would start before it.
                    cur = offered[other]
                    if cur is None or (at if at > free[other] else free[other], key) < (cur[0], cur[1]):
                        offer(other)
        offer(v)
    tasks.start = start_of
    return tasks


def _list_schedule(layout: Layout, kind: str, durations: Durations) -> dict[int, list[tuple[float, _Task]]]:
    """Per node, (start, task) in the order `_schedule` started them."""
    t = _schedule(layout, kind, durations)
    order: dict[int, list[tuple[float, _Task]]] = defaultdict(list)
    for i in t.picked:
        order[t.nodes[t.node[i]]].append((t.start[i], _Task(
            t.kind[i], t.mb[i], t.hop[i], t.nodes[t.node[i]], [i + d for d in t.deps[i]],
            _PRIORITY[t.kind[i]], t.duration[i], t.delta[i] > 0, t.delta[i] < 0,
        )))
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

    # Micro-batches of a pipeline mostly share their route: union and relabel each route once.
    distinct = [route for route in dict.fromkeys(layout.routes) if route]
    for route in distinct:
        first = root(route[0][1])
        for _, node in route[1:]:
            other = root(node)
            if other != first:
                parent[other] = first
    root_of = {route: root(route[0][1]) for route in distinct}
    groups: dict[int, list[int]] = defaultdict(list)
    for m, route in enumerate(layout.routes):
        if route:
            groups[root_of[route]].append(m)
    replicas_by_node: dict[int, list[int]] = defaultdict(list)
    for stage, node in layout.replicas:
        replicas_by_node[node].append(stage)
    parts = []
    for mbs in groups.values():
        names: dict[int, int] = {}
        pipes: dict[int, int] = {}
        relabelled: dict[tuple[Hop, ...], tuple[Hop, ...]] = {}
        route_list = []
        for m in mbs:
            route = layout.routes[m]
            new = relabelled.get(route)
            if new is None:
                new = relabelled[route] = tuple([(s, names.setdefault(n, len(names))) for s, n in route])
            route_list.append(new)
        routes = tuple(route_list)
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
            t = _schedule(part, kind, durations)
            lengths[part] = max(map(float.__add__, t.start, t.duration), default=0.0)
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


def _checked_schedule(layout: Layout, kind: str, durations: Durations | None) -> _Tasks:
    if kind not in ("1f1b", "fiw"):
        raise LayoutError(f"schedule {kind!r} is unknown; expected '1f1b' or 'fiw'")
    layout.validate()
    return _schedule(layout, kind, durations or stage_durations(layout))


class _Runs:
    """The layout's gradient all-reduce runs (`Layout.owner_runs`, those with owners) and, per
    (node, stage), the runs a backward of that stage on that node touches (found once per pair: a
    thousand-node group has tens of thousands of backwards and few pairs)."""

    def __init__(self, layout: Layout) -> None:
        self.stages = layout.stages
        self.runs = [(lo, hi, owners) for lo, hi, owners in layout.owner_runs() if owners]
        self.members = [frozenset(owners) for _, _, owners in self.runs]
        self.touched: dict[tuple[int, int], tuple[int, ...]] = {}

    def touched_by(self, node: int, stage: int) -> tuple[int, ...]:
        hit = self.touched.get((node, stage))
        if hit is None:
            lo, hi = self.stages[stage]
            hit = self.touched[(node, stage)] = tuple(
                r for r, (rlo, rhi, _) in enumerate(self.runs) if node in self.members[r] and rlo < hi and lo < rhi
            )
        return hit


def schedule_rows(layout: Layout, kind: str = "1f1b", durations: Durations | None = None) -> dict[int, list[Row]]:
    """`build_schedule`'s lists as `Row` tuples (the simulator replays tens of thousands of actions
    per coupled group; a frozen dataclass costs about 0.5 us each to build, a tuple almost nothing)."""
    t = _checked_schedule(layout, kind, durations)
    order: list[list[int]] = [[] for _ in t.nodes]
    for i in t.picked:
        order[t.node[i]].append(i)
    dense = {node: v for v, node in enumerate(t.nodes)}
    runs = _Runs(layout)
    routes, pipeline_of = layout.routes, layout.pipeline_of
    none = (0, 0)
    out: dict[int, list[Row]] = {}
    for node in layout.nodes():
        acts: list[Row] = []
        append = acts.append
        grad_touch: dict[int, int] = {}  # run index -> position after the node's last backward touching it
        for i in order[dense[node]] if node in dense else ():
            tkind, mb, hop = t.kind[i], t.mb[i], t.hop[i]
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
                for r in runs.touched_by(node, stage):
                    grad_touch[r] = len(acts)
        # Insert all-reduces after the last backward touching each run (replica-only runs: at the end).
        inserts: dict[int, list[Row]] = defaultdict(list)
        issued = []
        for r, (lo, hi, owners) in enumerate(runs.runs):
            if node in runs.members[r]:
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
            lo, hi, owners = runs.runs[r]
            merged.append((OPTIMIZER, -1, -1, -1, -1, (lo, hi), owners))
        out[node] = merged
    return out


Prices = tuple[dict[str, list[float]], Callable[[Row], float]]
"""`replay_end`'s `stage_price` and `group_price`."""


def step_end(layout: Layout, kind: str, durations: Durations | None, prices: Callable[[], Prices]) -> float:
    """`replay_end(schedule_rows(layout, kind, durations), *prices())` for prices under which an
    ALLREDUCE row costs nothing (`CostModel.action_prices`: the all-reduce's time is in the OPT that
    waits for it), without building the rows: one pass over the list schedule's picks. They are a
    topological order of the rows' replay (a task starts after its inputs, and each node's list is
    its picks in order), so every receive finds its send's time already known; the arithmetic is
    the replay's, operation for operation, so the float is the same. `prices` is called once the
    layout is checked (a bad layout raises `LayoutError` first, as `schedule_rows` does).
    `tests/runtime/test_replay.py` checks it (through `CostModel.step_time`) against `simulate`."""
    t = _checked_schedule(layout, kind, durations)
    stage_price, group_price = prices()
    ns = len(layout.stages)
    # Per (kind, stage) code (`_RouteTasks.code`): the action's price, its receive's and its send's.
    price = [stage_price[k][s] for k in _KINDS for s in range(ns)]
    recv_price = [stage_price[_RECV.get(k, RECV_ACT)][s] for k in _KINDS for s in range(ns)]
    send_price = [stage_price[_SEND.get(k, SEND_ACT)][s] for k in _KINDS for s in range(ns)]
    touches = [k in (BACKWARD, BACKWARD_WEIGHT) for k in _KINDS for _ in range(ns)]
    node_of, code_of, stage_of, recv_of, sends = t.node, t.code, t.stage, t.recv, t.sends
    clock = [0.0] * len(t.nodes)
    sent = [0.0] * len(node_of)  # task id -> when its output was sent
    done = [0] * len(t.nodes)  # tasks each node has run
    # Per (node, stage): `done` after and the clock after its last backward (B or W) touching gradients.
    last_at = [-1] * (len(t.nodes) * ns)
    last_clock = [0.0] * (len(t.nodes) * ns)
    for i in t.picked:
        v, c = node_of[i], code_of[i]
        done[v] += 1
        now = clock[v]
        off = recv_of[i]
        if off:
            ready = sent[i + off]
            if ready > now:
                now = ready
            now = now + recv_price[c]
        now = now + price[c]
        if sends[i]:
            sent[i] = now
            now = now + send_price[c]
        clock[v] = now
        if touches[c]:
            k = v * ns + stage_of[i]
            last_at[k] = done[v]
            last_clock[k] = now
    # A node issues a run's all-reduce after its last backward touching the run, or (replica-only
    # runs) after its last task; the all-reduces cost nothing, so they never move a clock.
    runs = _Runs(layout)
    issued: dict[tuple[int, int], tuple[int, float]] = {}  # (node, run) -> (`done` then, clock)
    for k, at in enumerate(last_at):
        if at >= 0:
            v, s = divmod(k, ns)
            node = t.nodes[v]
            for r in runs.touched_by(node, s):
                found = issued.get((node, r))
                if found is None or at > found[0]:
                    issued[(node, r)] = (at, last_clock[k])
    dense = {node: v for v, node in enumerate(t.nodes)}
    final = {node: clock[dense[node]] if node in dense else 0.0 for node in layout.nodes()}
    runs_of: dict[int, list[int]] = defaultdict(list)
    ready_of = []  # run -> when its last member issued it
    for r, (_, _, owners) in enumerate(runs.runs):
        for node in owners:
            runs_of[node].append(r)
        ready_of.append(max(issued[(node, r)][1] if (node, r) in issued else final[node] for node in owners))
    opt_rows = [(OPTIMIZER, -1, -1, -1, -1, (lo, hi), owners) for lo, hi, owners in runs.runs]
    end = 0.0
    for node, now in final.items():
        # OPTs in the order their all-reduces were issued (ties: run order; a run touched by the
        # node's last task ties with the replica-only ones, issued at the end).
        never = (done[dense[node]] if node in dense else 0, 0.0)
        for _, r in sorted((issued.get((node, r), never)[0], r) for r in runs_of.get(node, ())):
            if ready_of[r] > now:
                now = ready_of[r]
            now = now + group_price(opt_rows[r])
        if now > end:
            end = now
    return end


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
