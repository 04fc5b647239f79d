"""Preemption traces: load the public formats into one event list, and measure them.

A trace is a time-ordered list of membership events (a node joins or is taken back). Three file
formats are read:

* Bamboo CSV: ``t_ms,add|remove,nodeK``, one event per line.
* GCP availability counts: ``YYYY-MM-DD, HH:MM:SS, available_count``; a drop of the count is a
  preemption of that many (anonymous) nodes, a rise is that many replacements.
* SkyPilot JSON ticks: ``{"metadata": {"gap_seconds": g}, "data": [value per tick]}`` for one node.
  In the "Can't Be Late" collection a tick of ``1`` means the spot instance is preempted
  (unavailable) and ``0`` that it runs; the trace starts at 0 (running). ``preempted_value``
  flips that if a trace uses the other convention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ADD = "add"
REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One membership change at `t_s` seconds from the trace start."""

    t_s: float
    kind: str
    """`add` (a node becomes available) or `remove` (a node is preempted)."""
    node: str


@dataclass(slots=True)
class Trace:
    """Membership events of a spot cluster, sorted by time (removals before adds at equal times)."""

    name: str
    events: list[TraceEvent]
    duration_s: float
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.events.sort(key=lambda e: (e.t_s, e.kind != REMOVE))

    # -- measurements ------------------------------------------------------------------------
    def initial_nodes(self) -> int:
        """Nodes present at t=0 (adds at the first timestamp)."""
        return sum(1 for e in self.events if e.kind == ADD and e.t_s == 0)

    def preemptions(self) -> int:
        """Nodes taken back over the whole trace."""
        return sum(1 for e in self.events if e.kind == REMOVE)

    def replacements(self) -> int:
        """Nodes that joined after the first preemption (the ramp-up before it is not a replacement)."""
        removals = [e.t_s for e in self.events if e.kind == REMOVE]
        if not removals:
            return 0
        first = min(removals)
        return sum(1 for e in self.events if e.kind == ADD and e.t_s > first)

    def preemption_events(self) -> int:
        """Distinct preemption instants (a burst of removals at one time counts once)."""
        return len({e.t_s for e in self.events if e.kind == REMOVE})

    def mean_burst(self) -> float:
        """Nodes lost per preemption instant."""
        events = self.preemption_events()
        return self.preemptions() / events if events else 0.0

    def node_count_series(self) -> list[tuple[float, int]]:
        """(time, live nodes after the events at that time), one point per distinct time."""
        live: set[str] = set()
        out: list[tuple[float, int]] = []
        for e in self.events:
            if e.kind == ADD:
                live.add(e.node)
            else:
                live.discard(e.node)
            if out and out[-1][0] == e.t_s:
                out[-1] = (e.t_s, len(live))
            else:
                out.append((e.t_s, len(live)))
        return out

    def node_hours(self) -> float:
        """Integral of live nodes over the trace, in node-hours."""
        series = self.node_count_series()
        total = 0.0
        for (t0, n), (t1, _) in zip(series, [*series[1:], (self.duration_s, 0)], strict=True):
            total += n * max(0.0, t1 - t0)
        return total / 3600.0

    def preemption_rate(self) -> float:
        """Preemptions per node-hour."""
        hours = self.node_hours()
        return self.preemptions() / hours if hours else 0.0

    def max_nodes(self) -> int:
        """Most nodes live at once."""
        return max((n for _, n in self.node_count_series()), default=0)

    def summary(self) -> dict:
        """The figures the README of a trace quotes, JSON-ready."""
        return {
            "name": self.name,
            "duration_hours": round(self.duration_s / 3600, 3),
            "initial_nodes": self.initial_nodes(),
            "max_nodes": self.max_nodes(),
            "preemptions": self.preemptions(),
            "preemption_events": self.preemption_events(),
            "nodes_per_preemption_event": round(self.mean_burst(), 3),
            "replacements": self.replacements(),
            "node_hours": round(self.node_hours(), 2),
            "preemptions_per_node_hour": round(self.preemption_rate(), 4),
        }

    def scaled(self, factor: int) -> Trace:
        """The trace replicated `factor` times side by side (node names suffixed), for bigger clusters."""
        events = [TraceEvent(e.t_s, e.kind, f"{e.node}#{k}") for k in range(factor) for e in self.events]
        return Trace(name=f"{self.name}x{factor}", events=events, duration_s=self.duration_s, meta=dict(self.meta))


class TraceFormatError(ValueError):
    """A trace file that matches no known format; the message names the line and what was expected."""


def load_bamboo_csv(path: Path | str) -> Trace:
    """Bamboo's `t_ms,add|remove,nodeK` trace."""
    path = Path(path)
    events = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or parts[1] not in (ADD, REMOVE):
            raise TraceFormatError(f"{path.name}:{number}: {line!r}; expected 't_ms,add|remove,node'")
        try:
            t_ms = float(parts[0])
        except ValueError as exc:
            raise TraceFormatError(f"{path.name}:{number}: time {parts[0]!r} is not a number of ms") from exc
        events.append(TraceEvent(t_ms / 1000.0, parts[1], parts[2]))
    if not events:
        raise TraceFormatError(f"{path.name}: no events")
    duration = max(e.t_s for e in events)
    return Trace(name=path.stem, events=events, duration_s=duration, meta={"format": "bamboo-csv"})


def counts_to_events(times_s: list[float], counts: list[int]) -> list[TraceEvent]:
    """Turn a series of available-node counts into add/remove events of anonymous nodes (LIFO)."""
    events: list[TraceEvent] = []
    live: list[str] = []
    serial = 0
    for t, n in zip(times_s, counts, strict=True):
        while len(live) < n:
            serial += 1
            live.append(f"node{serial}")
            events.append(TraceEvent(t, ADD, live[-1]))
        while len(live) > n:
            events.append(TraceEvent(t, REMOVE, live.pop()))
    return events


def load_gcp_counts(path: Path | str) -> Trace:
    """The `YYYY-MM-DD, HH:MM:SS, available_count` availability trace."""
    path = Path(path)
    times, counts = [], []
    start = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S")
            count = int(parts[2])
        except (ValueError, IndexError) as exc:
            raise TraceFormatError(
                f"{path.name}:{number}: {line!r}; expected 'YYYY-MM-DD, HH:MM:SS, available_count'"
            ) from exc
        start = start or stamp
        times.append((stamp - start).total_seconds())
        counts.append(count)
    if not times:
        raise TraceFormatError(f"{path.name}: no samples")
    return Trace(
        name=path.stem,
        events=counts_to_events(times, counts),
        duration_s=times[-1],
        meta={"format": "gcp-counts"},
    )


def load_skypilot_json(path: Path | str, *, preempted_value: int = 1) -> Trace:
    """A SkyPilot spot-trace JSON for one node (tick value `preempted_value` = preempted)."""
    path = Path(path)
    data = json.loads(path.read_text())
    try:
        gap = float(data["metadata"]["gap_seconds"])
        ticks = list(data["data"])
    except (KeyError, TypeError) as exc:
        raise TraceFormatError(f"{path.name}: expected {{'metadata': {{'gap_seconds': g}}, 'data': [...]}}") from exc
    counts = [0 if int(v) == preempted_value else 1 for v in ticks]
    times = [i * gap for i in range(len(ticks))]
    return Trace(
        name=path.stem,
        events=counts_to_events(times, counts),
        duration_s=len(ticks) * gap,
        meta={"format": "skypilot-json", "gap_seconds": gap, "preempted_value": preempted_value},
    )


def load_trace(path: Path | str) -> Trace:
    """Load any supported format, chosen by content."""
    path = Path(path)
    head = path.read_text()[:200].lstrip()
    if head.startswith("{"):
        return load_skypilot_json(path)
    first = head.splitlines()[0] if head else ""
    if first.count(",") == 2 and (" add" in first or ",add" in first or ",remove" in first):
        return load_bamboo_csv(path)
    if first[:4].isdigit() and first[4:5] == "-":
        return load_gcp_counts(path)
    raise TraceFormatError(f"{path.name}: unknown trace format (first line {first!r})")
