"""Preemption schedules for local nodes: load a real trace, or generate a seeded synthetic one that
is calibrated to the real traces (bursty, 0.1-0.6 preemptions per node-hour). Pure Python, no
Django: the demo driver and the benchmarks use it directly.

Trace formats (see the reference data README):
- Bamboo CSV `t_ms,add|remove,nodeK`, one event a line;
- GCP availability `YYYY-MM-DD, HH:MM:SS, available_count`;
- SkyPilot JSON `{"metadata": {"gap_seconds": g}, "data": [0|1 per tick]}` for one node. We read 1 as
  "preempted" (0 = the node runs): read that way the trace starts with a running node and its rate
  (0.34 per node-hour) falls in the band of the other traces; read the other way it would be 0.73.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from pathlib import Path

# Calibration from the reference traces (per node-hour; mean nodes lost per preemption event):
# aws-p3.2xlarge 0.61 / 2.1, aws-g4dn 0.55, gcp-a100 0.10 / 4.3, skypilot v100 0.34 / 1.
DEFAULT_RATE_PER_NODE_HOUR = 0.35
DEFAULT_NODES_PER_EVENT = 2.1


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """A node joins (`add`) or is preempted (`remove`) at `t_s` seconds from the trace's start."""

    t_s: float
    kind: str
    node: str


@dataclass(frozen=True, slots=True)
class TraceStats:
    preemptions: int
    events: int
    node_hours: float
    duration_h: float
    max_nodes: int

    @property
    def rate_per_node_hour(self) -> float:
        return self.preemptions / self.node_hours if self.node_hours else 0.0

    @property
    def nodes_per_event(self) -> float:
        return self.preemptions / self.events if self.events else 0.0


@dataclass(frozen=True, slots=True)
class Trace:
    """A sequence of add/remove events, sorted by time."""

    name: str
    events: tuple[TraceEvent, ...]
    duration_s: float

    def removal_groups(self) -> list[tuple[float, list[str]]]:
        """Preemption events: nodes removed at the same instant form one (bursty) event."""
        removes = [e for e in self.events if e.kind == "remove"]
        return [(t, [e.node for e in group]) for t, group in groupby(removes, key=lambda e: e.t_s)]

    def stats(self) -> TraceStats:
        """Preemptions, node-hours (integral of live nodes) and burstiness."""
        live: set[str] = set()
        node_seconds = 0.0
        last_t = 0.0
        max_nodes = 0
        for event in self.events:
            node_seconds += len(live) * (event.t_s - last_t)
            last_t = event.t_s
            if event.kind == "add":
                live.add(event.node)
            else:
                live.discard(event.node)
            max_nodes = max(max_nodes, len(live))
        node_seconds += len(live) * max(0.0, self.duration_s - last_t)
        groups = self.removal_groups()
        return TraceStats(
            preemptions=sum(len(nodes) for _, nodes in groups), events=len(groups),
            node_hours=node_seconds / 3600, duration_h=self.duration_s / 3600, max_nodes=max_nodes,
        )


class TraceFormatError(ValueError):
    """The file is not in a trace format we know; the message names the line."""


def _bamboo_csv(path: Path) -> list[TraceEvent]:
    events = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or parts[1] not in ("add", "remove"):
            raise TraceFormatError(f"{path.name}:{number}: expected 't_ms,add|remove,node', got {line!r}")
        events.append(TraceEvent(t_s=int(parts[0]) / 1000, kind=parts[1], node=parts[2]))
    return events


def _gcp_counts(path: Path) -> list[TraceEvent]:
    points = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            when = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S")
            points.append((when, int(parts[2])))
        except (ValueError, IndexError) as exc:
            raise TraceFormatError(
                f"{path.name}:{number}: expected 'YYYY-MM-DD, HH:MM:SS, count', got {line!r}"
            ) from exc
    if not points:
        return []
    start = points[0][0]
    events: list[TraceEvent] = []
    count = 0
    for when, available in points:
        t = (when - start).total_seconds()
        # Nodes are a stack: the highest-numbered ones leave first, and come back first.
        while count < available:
            events.append(TraceEvent(t_s=t, kind="add", node=f"node{count}"))
            count += 1
        while count > available:
            count -= 1
            events.append(TraceEvent(t_s=t, kind="remove", node=f"node{count}"))
    return events


def _skypilot_json(path: Path) -> tuple[list[TraceEvent], float]:
    data = json.loads(path.read_text())
    try:
        gap = float(data["metadata"]["gap_seconds"])
        ticks = data["data"]
    except (KeyError, TypeError) as exc:
        raise TraceFormatError(f"{path.name}: expected {{'metadata': {{'gap_seconds'}}, 'data': [...]}}") from exc
    events = []
    previous = 1  # before the trace: not running, so a first 0 is a join
    for index, value in enumerate(ticks):
        if value == 0 and previous == 1:
            events.append(TraceEvent(t_s=index * gap, kind="add", node="node0"))
        elif value == 1 and previous == 0:
            events.append(TraceEvent(t_s=index * gap, kind="remove", node="node0"))
        previous = value
    return events, len(ticks) * gap


def load_trace(path: Path | str) -> Trace:
    """Load any of the three trace formats (by content, not by name)."""
    path = Path(path)
    head = path.read_text()[:200].lstrip()
    if head.startswith("{"):
        events, duration = _skypilot_json(path)
    else:
        first = head.splitlines()[0] if head else ""
        events = _bamboo_csv(path) if ("add" in first or "remove" in first) else _gcp_counts(path)
        duration = max((e.t_s for e in events), default=0.0)
    events.sort(key=lambda e: (e.t_s, e.kind != "add"))
    return Trace(name=path.name, events=tuple(events), duration_s=duration)


def synthetic_trace(
    *, seed: int, nodes: int, duration_s: float, rate_per_node_hour: float = DEFAULT_RATE_PER_NODE_HOUR,
    nodes_per_event: float = DEFAULT_NODES_PER_EVENT, replace_after_s: tuple[float, float] = (60.0, 600.0),
) -> Trace:
    """A seeded synthetic trace: `nodes` start at t=0; preemption events arrive as a Poisson process
    whose rate keeps `rate_per_node_hour` per live node; each event takes a burst of nodes
    (1 + geometric, mean `nodes_per_event`); each lost node is replaced after a uniform delay in
    `replace_after_s`. The same seed gives the same trace."""
    if nodes < 1 or duration_s <= 0:
        raise ValueError(f"nodes={nodes} and duration_s={duration_s} must be positive")
    if rate_per_node_hour <= 0 or nodes_per_event < 1:
        raise ValueError("rate_per_node_hour must be > 0 and nodes_per_event >= 1")
    rng = random.Random(seed)
    events = [TraceEvent(t_s=0.0, kind="add", node=f"node{i}") for i in range(nodes)]
    live = [f"node{i}" for i in range(nodes)]
    pending: list[tuple[float, str]] = []  # (time, node) replacements to come
    next_id = nodes
    t = 0.0
    p_more = 1 - 1 / nodes_per_event  # geometric extra nodes with mean nodes_per_event - 1
    while True:
        event_rate = rate_per_node_hour * max(len(live), 1) / nodes_per_event / 3600
        t_next = t + rng.expovariate(event_rate)
        while pending and pending[0][0] <= t_next:
            at, node = pending.pop(0)
            if at > duration_s:
                break
            events.append(TraceEvent(t_s=at, kind="add", node=node))
            live.append(node)
        t = t_next
        if t > duration_s:
            break
        if not live:
            continue
        burst = 1
        while rng.random() < p_more:
            burst += 1
        victims = rng.sample(sorted(live), min(burst, len(live)))
        for node in victims:
            live.remove(node)
            events.append(TraceEvent(t_s=t, kind="remove", node=node))
            pending.append((t + rng.uniform(*replace_after_s), f"node{next_id}"))
            next_id += 1
        pending.sort()
    events.sort(key=lambda e: (e.t_s, e.kind != "add"))
    return Trace(name=f"synthetic-seed{seed}", events=tuple(events), duration_s=duration_s)


@dataclass(frozen=True, slots=True)
class PlannedPreemption:
    """Preempt `count` of the job's nodes at `at_s` (scaled seconds), with a notice or without."""

    at_s: float
    count: int
    with_notice: bool


def preemption_plan(trace: Trace, *, time_scale: float, seed: int = 0, notice_fraction: float = 0.8,
                    limit_s: float = math.inf) -> list[PlannedPreemption]:
    """The trace's preemption events, time-scaled for a demo (`time_scale` = demo seconds per trace
    second); a seeded `notice_fraction` of them come with a notice, the rest are silent kills."""
    rng = random.Random(seed)
    plan = []
    for t, nodes in trace.removal_groups():
        at = t * time_scale
        if at > limit_s:
            break
        plan.append(PlannedPreemption(at_s=at, count=len(nodes), with_notice=rng.random() < notice_fraction))
    return plan
