"""Preemption and availability traces: load the public formats into one event list, and measure them.

A trace is a time-ordered list of membership events (a node joins or is taken back). Every accepted
file has a named format (`FORMATS`); the JSON tick formats share one shape and differ only in what
a tick means, so their format is named (in the file or by the caller), never guessed:

* ``bamboo-csv``: ``t_ms,add|remove,nodeK``, one event per line.
* ``gcp-counts``: ``YYYY-MM-DD, HH:MM:SS, available_count``; a drop of the count is a preemption of
  that many (anonymous) nodes, a rise is that many replacements.
* ``preemption-ticks``: ``{"metadata": {"gap_seconds": g}, "data": [value per tick]}`` for one node.
  In the "Can't Be Late" (NSDI'24) collection a tick of ``1`` means the spot instance is preempted
  (unavailable) and ``0`` that it runs; the trace starts at 0 (running). ``preempted_value`` flips
  that if a trace uses the other convention.
* ``availability-count``: the same JSON shape, each tick the number of nodes available (SkyPilot's
  spot-traces availability counts): a 16-node trace is a 16-node fleet.

The two CSV/text formats are recognised by their line syntax (unambiguous); a JSON file names its
format in ``metadata.format`` (or a top-level ``format``), or the caller passes ``format=``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ADD = "add"
REMOVE = "remove"

BAMBOO_CSV = "bamboo-csv"
GCP_COUNTS = "gcp-counts"
PREEMPTION_TICKS = "preemption-ticks"
AVAILABILITY_COUNT = "availability-count"
FORMATS: dict[str, str] = {
    BAMBOO_CSV: "Bamboo CSV, `t_ms,add|remove,nodeK` a line",
    GCP_COUNTS: "GCP availability counts, `YYYY-MM-DD, HH:MM:SS, available_count` a line",
    PREEMPTION_TICKS: "JSON ticks for one node, 1 = preempted (Can't Be Late)",
    AVAILABILITY_COUNT: "JSON ticks, each the number of nodes available (SkyPilot availability counts)",
}
"""Every accepted trace format and what it means."""
JSON_FORMATS = (PREEMPTION_TICKS, AVAILABILITY_COUNT)


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
    return Trace(name=path.stem, events=events, duration_s=duration, meta={"format": BAMBOO_CSV})


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
        meta={"format": GCP_COUNTS},
    )


def _read_ticks(path: Path) -> tuple[dict, float, list]:
    """The JSON tick shape shared by the tick formats: (whole document, gap seconds, ticks)."""
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise TraceFormatError(f"{path.name}: not JSON ({exc})") from exc
    try:
        gap = float(data["metadata"]["gap_seconds"])
        ticks = list(data["data"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"{path.name}: expected {{'metadata': {{'gap_seconds': g}}, 'data': [...]}}") from exc
    if gap <= 0 or not ticks:
        raise TraceFormatError(f"{path.name}: needs gap_seconds > 0 and at least one tick")
    return data, gap, ticks


def _json_format(path: Path, data: dict, format: str | None) -> str:
    """The tick format named by the file or the caller; both naming different ones, or neither, is an error."""
    named = data.get("metadata", {}).get("format") or data.get("format")
    if named is not None and named not in JSON_FORMATS:
        raise TraceFormatError(f"{path.name}: format {named!r} is not a JSON tick format; one of {JSON_FORMATS}")
    if format is not None and named is not None and format != named:
        raise TraceFormatError(f"{path.name}: the file says format {named!r}, the caller {format!r}")
    chosen = format or named
    if chosen is None:
        # The same shape means one node's preemptions in one collection and a fleet's size in
        # another: reading the wrong one simulates a 16-node fleet as one node, so never guess.
        raise TraceFormatError(
            f"{path.name}: JSON ticks do not say what a tick means; name the format in metadata.format or "
            f"pass format=: {PREEMPTION_TICKS!r} (one node, tick 1 = preempted) or {AVAILABILITY_COUNT!r} "
            f"(tick = nodes available)"
        )
    return chosen


def _ticks_trace(path: Path, gap: float, counts: list[int], meta: dict) -> Trace:
    times = [i * gap for i in range(len(counts))]
    return Trace(name=path.stem, events=counts_to_events(times, counts), duration_s=len(counts) * gap, meta=meta)


def load_preemption_ticks(path: Path | str, *, preempted_value: int = 1) -> Trace:
    """A one-node preemption-tick JSON (tick value `preempted_value` = preempted, else running)."""
    path = Path(path)
    data, gap, ticks = _read_ticks(path)
    _json_format(path, data, PREEMPTION_TICKS)
    counts = [0 if int(v) == preempted_value else 1 for v in ticks]
    meta = {"format": PREEMPTION_TICKS, "gap_seconds": gap, "preempted_value": preempted_value}
    return _ticks_trace(path, gap, counts, meta)


def load_availability_count(path: Path | str) -> Trace:
    """An availability-count JSON: each tick the number of nodes available (that many nodes live)."""
    path = Path(path)
    data, gap, ticks = _read_ticks(path)
    _json_format(path, data, AVAILABILITY_COUNT)
    try:
        counts = [int(v) for v in ticks]
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{path.name}: availability counts must be whole numbers") from exc
    if min(counts) < 0:
        raise TraceFormatError(f"{path.name}: a negative availability count")
    meta = {"format": AVAILABILITY_COUNT, "gap_seconds": gap, **{
        k: v for k, v in data.get("metadata", {}).items() if k not in ("format", "gap_seconds")}}
    return _ticks_trace(path, gap, counts, meta)


def load_skypilot_json(path: Path | str, *, format: str | None = None, preempted_value: int = 1) -> Trace:
    """A SkyPilot-shaped tick JSON, read as the format the file or `format` names (see the module doc)."""
    path = Path(path)
    data, _, _ = _read_ticks(path)
    if _json_format(path, data, format) == AVAILABILITY_COUNT:
        return load_availability_count(path)
    return load_preemption_ticks(path, preempted_value=preempted_value)


def load_trace(path: Path | str, *, format: str | None = None) -> Trace:
    """Load any supported format: `format` (one of `FORMATS`), else the one a JSON file names, else
    the CSV/text format its first line's syntax shows. JSON ticks naming no format are refused."""
    path = Path(path)
    if format is not None and format not in FORMATS:
        raise TraceFormatError(f"unknown trace format {format!r}; one of {', '.join(FORMATS)}")
    if format == BAMBOO_CSV:
        return load_bamboo_csv(path)
    if format == GCP_COUNTS:
        return load_gcp_counts(path)
    head = path.read_text()[:200].lstrip()
    if format is not None or head.startswith("{"):
        return load_skypilot_json(path, format=format)
    first = head.splitlines()[0] if head else ""
    if first.count(",") == 2 and (" add" in first or ",add" in first or ",remove" in first):
        return load_bamboo_csv(path)
    if first[:4].isdigit() and first[4:5] == "-":
        return load_gcp_counts(path)
    raise TraceFormatError(f"{path.name}: unknown trace format (first line {first!r}); one of {', '.join(FORMATS)}")
