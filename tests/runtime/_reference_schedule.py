"""The list scheduler as it was before the heap (a scan of every ready task per pick; code as of
main fd69199), kept as the reference the heap version must reproduce exactly
(`test_list_schedule.py`); and the action lists and step time as they were before the simulator's
fast path (`schedule_rows`, `replay_end`), the reference for `test_replay.py`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from runtime.parallel.layout import Layout
from runtime.parallel.schedule import (
    ALL_REDUCE,
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    OPTIMIZER,
    RECV_ACT,
    RECV_GRAD,
    REDUNDANT_FORWARD,
    SEND_ACT,
    SEND_GRAD,
    Action,
    Durations,
    ScheduleError,
    _list_schedule,
    simulate,
    stage_durations,
)
from runtime.parallel.throughput import CostModel


@dataclass(slots=True)
class _Task:
    kind: str
    mb: int
    hop: int
    node: int
    deps: list[tuple[int, int, str]]  # (mb, hop, kind) that must finish first
    priority: int
    duration: float
    first_on_node: bool  # F of the first hop of this micro-batch on this node (counts as in flight)
    releases: bool  # this backward ends the micro-batch's stay on the node


def _make_tasks(layout: Layout, kind: str, durations: Durations) -> dict[tuple[int, int, str], _Task]:
    split = kind == "fiw"
    prio = {BACKWARD_INPUT: 0, BACKWARD: 0, FORWARD: 1, BACKWARD_WEIGHT: 2, REDUNDANT_FORWARD: 3}
    replicas = defaultdict(set)
    for stage, node in layout.replicas:
        replicas[node].add(stage)
    tasks: dict[tuple[int, int, str], _Task] = {}
    for m, route in enumerate(layout.routes):
        last = len(route) - 1
        first_hop_on = {}
        for h, (_, node) in enumerate(route):
            first_hop_on.setdefault(node, h)
        for h, (stage, node) in enumerate(route):
            f, i, w = durations[stage]
            fdeps = [(m, h - 1, FORWARD)] if h else []
            first = first_hop_on[node] == h
            tasks[(m, h, FORWARD)] = _Task(FORWARD, m, h, node, fdeps, prio[FORWARD], f, first, False)
            bdeps = [(m, h, FORWARD)]
            if h < last:
                bdeps.append((m, h + 1, BACKWARD_INPUT if split else BACKWARD))
            if split and h > 0:
                tasks[(m, h, BACKWARD_INPUT)] = _Task(
                    BACKWARD_INPUT, m, h, node, bdeps, prio[BACKWARD_INPUT], i, False, first
                )
                tasks[(m, h, BACKWARD_WEIGHT)] = _Task(
                    BACKWARD_WEIGHT,
                    m,
                    h,
                    node,
                    [(m, h, BACKWARD_INPUT)],
                    prio[BACKWARD_WEIGHT],
                    w,
                    False,
                    False,
                )
            else:
                # The first hop has no input gradient to hurry, so it always runs fused.
                tasks[(m, h, BACKWARD)] = _Task(BACKWARD, m, h, node, bdeps, prio[BACKWARD], i + w, False, first)
            # bamboo: the node holding the next hop's stage as a replica runs its forward eagerly.
            succ_stage = route[(h + 1) % len(route)][0]
            if len(route) > 1 and succ_stage in replicas[node] and route[(h + 1) % len(route)][1] != node:
                rdeps = [(m, h, FORWARD)] if h < last else []
                tasks[(m, h, REDUNDANT_FORWARD)] = _Task(
                    REDUNDANT_FORWARD,
                    m,
                    h,
                    node,
                    rdeps,
                    prio[REDUNDANT_FORWARD],
                    durations[succ_stage][0],
                    False,
                    False,
                )
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


def reference_list_schedule(layout: Layout, kind: str, durations: Durations) -> dict[int, list[tuple[float, _Task]]]:
    """Per node, (start, task) in the order the scan-based list scheduler picked them."""
    tasks = _make_tasks(layout, kind, durations)
    caps = _in_flight_caps(layout)
    waiting = {key: len(task.deps) for key, task in tasks.items()}
    dependents: dict[tuple[int, int, str], list[tuple[int, int, str]]] = defaultdict(list)
    for key, task in tasks.items():
        for dep in task.deps:
            dependents[dep].append(key)
    finish: dict[tuple[int, int, str], float] = {}
    free: dict[int, float] = defaultdict(float)
    in_flight: dict[tuple[int, int], int] = defaultdict(int)
    ready: dict[int, dict[tuple[int, int, str], float]] = defaultdict(dict)
    for key, task in tasks.items():
        if not task.deps:
            ready[task.node][key] = 0.0
    order: dict[int, list[tuple[float, _Task]]] = defaultdict(list)
    for _ in range(len(tasks)):
        best = None
        for node, keys in ready.items():
            node_free = free[node]
            for key, inputs_ready in keys.items():
                task = tasks[key]
                start = inputs_ready if inputs_ready > node_free else node_free
                if best is not None and start > best[0][0]:
                    continue
                slot = (node, layout.pipeline_of[task.mb])
                if task.first_on_node and task.kind == FORWARD and in_flight[slot] >= caps[slot]:
                    continue
                rank = (start, task.priority, task.mb, task.hop, node)
                if best is None or rank < best[0]:
                    best = (rank, node, key)
        if best is None:
            raise ScheduleError("no task can start: the layout's routes form a cycle or a node's memory cap is 0")
        (start, *_), node, key = best
        task = tasks[key]
        del ready[node][key]
        finish[key] = start + task.duration
        free[node] = finish[key]
        in_flight[(node, layout.pipeline_of[task.mb])] += int(task.first_on_node) - int(task.releases)
        order[node].append((start, task))
        for child in dependents[key]:
            waiting[child] -= 1
            if not waiting[child]:
                ready[tasks[child].node][child] = max(finish[d] for d in tasks[child].deps)
    return order


def reference_build_schedule(layout: Layout, kind: str, durations: Durations) -> dict[int, list[Action]]:
    """`build_schedule` as it was before it was built from `schedule_rows` (main 2026-11-27): the
    per-node action lists, communication inserted around the list schedule's order."""
    order = _list_schedule(layout, kind, durations)
    runs = [(lo, hi, owners) for lo, hi, owners in layout.owner_runs() if owners]
    out: dict[int, list[Action]] = {}
    for node in layout.nodes():
        acts: list[Action] = []
        grad_touch: dict[int, int] = {}
        for _, task in order.get(node, []):
            route = layout.routes[task.mb]
            stage = route[task.hop][0]
            pipe = layout.pipeline_of[task.mb]
            prev_node = route[task.hop - 1][1] if task.hop else -1
            next_node = route[task.hop + 1][1] if task.hop + 1 < len(route) else -1
            if task.kind == FORWARD:
                if task.hop and prev_node != node:
                    acts.append(Action(RECV_ACT, stage, task.mb, prev_node, pipe))
                acts.append(Action(FORWARD, stage, task.mb, -1, pipe))
                if next_node >= 0 and next_node != node:
                    acts.append(Action(SEND_ACT, stage, task.mb, next_node, pipe))
            elif task.kind in (BACKWARD, BACKWARD_INPUT):
                if next_node >= 0 and next_node != node:
                    acts.append(Action(RECV_GRAD, stage, task.mb, next_node, pipe))
                acts.append(Action(task.kind, stage, task.mb, -1, pipe))
                if task.hop and prev_node != node:
                    acts.append(Action(SEND_GRAD, stage, task.mb, prev_node, pipe))
            elif task.kind == REDUNDANT_FORWARD:
                succ_stage = route[(task.hop + 1) % len(route)][0]
                acts.append(Action(REDUNDANT_FORWARD, succ_stage, task.mb, -1, pipe))
            else:
                acts.append(Action(task.kind, stage, task.mb, -1, pipe))
            if task.kind in (BACKWARD, BACKWARD_WEIGHT):
                lo, hi = layout.stages[stage]
                for r, (rlo, rhi, owners) in enumerate(runs):
                    if node in owners and rlo < hi and lo < rhi:
                        grad_touch[r] = len(acts)
        inserts: dict[int, list[Action]] = defaultdict(list)
        issued = []
        for r, (lo, hi, owners) in enumerate(runs):
            if node in owners:
                at = grad_touch.get(r, len(acts))
                inserts[at].append(Action(ALL_REDUCE, layers=(lo, hi), group=owners))
                issued.append((at, r))
        merged: list[Action] = []
        for pos in range(len(acts) + 1):
            merged.extend(inserts.get(pos, []))
            if pos < len(acts):
                merged.append(acts[pos])
        for _, r in sorted(issued):
            lo, hi, owners = runs[r]
            merged.append(Action(OPTIMIZER, layers=(lo, hi), group=owners))
        out[node] = merged
    return out


def reference_step_time(cost: CostModel, layout: Layout, kind: str, allreduce_scale: int) -> float:
    """`CostModel.step_time` as it was (main 2026-11-27): `simulate` of the action lists with a
    duration computed per action."""
    per_stage = stage_durations(layout, cost.fiw)
    scale, net = cost.compute_scale, cost.network

    def duration(act: Action) -> float:
        k = act.kind
        if k in (FORWARD, REDUNDANT_FORWARD):
            return per_stage[act.stage][0] * scale
        if k == BACKWARD_INPUT:
            return per_stage[act.stage][1] * scale
        if k == BACKWARD_WEIGHT:
            return per_stage[act.stage][2] * scale
        if k == BACKWARD:
            return (per_stage[act.stage][1] + per_stage[act.stage][2]) * scale
        if k == RECV_ACT:
            return net.latency_s + cost.output_bytes[layout.stages[act.stage][0] - 1] / net.bytes_per_s
        if k == RECV_GRAD:
            return net.latency_s + cost.output_bytes[layout.stages[act.stage][1] - 1] / net.bytes_per_s
        if k == OPTIMIZER:
            lo, hi = act.layers
            return cost.optimizer_time(lo, hi, len(act.group) * allreduce_scale)
        return 0.0

    timeline = simulate(reference_build_schedule(layout, kind, per_stage), duration)
    return max((e for row in timeline.values() for _, e, _ in row), default=0.0) + cost.step_overhead_s
