"""The demo's preemption schedule: a trace (synthetic and seeded, or a file the user names),
compressed onto the job's progress.

The first preemption events of the trace are kept (as many as the demo's length allows); the trace
time of event i, t_i, is mapped onto the job's steps, linearly, so that the last kept event falls at
WINDOW[1] of the job's steps and trace time 0 at WINDOW[0]: event i fires once the job has done
(WINDOW[0] + (WINDOW[1] - WINDOW[0]) * t_i / t_last) of its steps. Anchoring to progress rather
than to the wall clock keeps the preemptions inside the run on a slow or a fast machine alike.

Each event comes with a notice (the node dies NOTICE_S seconds later, after the agent has seen the
notice in its metadata endpoint) or without (the node's processes are killed on the spot), drawn with
the seed; when the kept events are all of one kind, the last one is flipped, so that a demo shows
both. A burst (several nodes in one event) takes nodes of different stages and different pipelines
first, at most dp - 1 per stage, so that the job can keep going without them. The same seed gives the same
schedule and the same victims (by pipeline and stage).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from runtime.sim.synthetic import synthetic_trace
from runtime.traces import REMOVE, Trace, load_trace

WINDOW = (0.1, 0.55)
NOTICE_S = 4.0
# Calibration of the synthetic trace: the AWS p3.2xlarge cluster trace of Bamboo (0.61 preemptions
# per node-hour, 2.1 nodes per event), the burstiest public GPU trace.
SYNTHETIC_RATE_PER_NODE_HOUR = 0.61
SYNTHETIC_MEAN_BURST = 2.1
SYNTHETIC_HOURS = 48.0


@dataclass(frozen=True, slots=True)
class Preemption:
    """One scheduled preemption event of the demo."""

    index: int
    trace_t_s: float
    """When it happened in the trace (seconds from its start)."""
    at_fraction: float
    """Fire once the job has done this fraction of its steps."""
    count: int
    """Nodes the trace took in this event."""
    with_notice: bool
    victims: tuple[tuple[int, int], ...]
    """(pipeline, stage) positions to take, in order of preference (may hold more than `count`)."""


def demo_trace(*, nodes: int, seed: int, path: Path | None = None, trace_format: str | None = None) -> Trace:
    """The trace of the demo: the file at `path` (read as `trace_format`, see `runtime.traces.FORMATS`),
    or a seeded synthetic one for `nodes` nodes."""
    if path is not None:
        return load_trace(path, format=trace_format)
    return synthetic_trace(nodes=nodes, hours=SYNTHETIC_HOURS, rate_per_node_hour=SYNTHETIC_RATE_PER_NODE_HOUR,
                           mean_burst=SYNTHETIC_MEAN_BURST, seed=seed)


def removal_events(trace: Trace) -> list[tuple[float, int]]:
    """(time, nodes removed) of every preemption event (removals at one instant form one event)."""
    removes = [e for e in trace.events if e.kind == REMOVE]
    return [(t, len(list(group))) for t, group in groupby(removes, key=lambda e: e.t_s)]


def _victim_order(rng: random.Random, *, dp: int, pp: int) -> tuple[tuple[int, int], ...]:
    """Every (pipeline, stage) position, in the order victims are taken: each next one in the stage
    and the pipeline hit least so far (ties in a seeded order). Spreading over stages keeps a live
    copy of every stage (recycle); spreading over pipelines keeps each lost node's ring successor,
    which holds its replica (bamboo), and keeps whole pipelines for checkpoint-restart."""
    positions = [(p, s) for p in range(dp) for s in range(pp)]
    rng.shuffle(positions)
    order: list[tuple[int, int]] = []
    while positions:
        best = min(positions, key=lambda pos: (sum(1 for _, s in order if s == pos[1]),
                                               sum(1 for p, _ in order if p == pos[0])))
        positions.remove(best)
        order.append(best)
    return tuple(order)


def demo_schedule(trace: Trace, *, seed: int, dp: int, pp: int, max_events: int,
                  notice_fraction: float = 0.5) -> list[Preemption]:
    """The first `max_events` preemption events of `trace`, compressed onto the job's progress."""
    events = [e for e in removal_events(trace) if e[0] > 0][:max_events]
    if not events:
        return []
    rng = random.Random(seed)
    last = events[-1][0]
    lo, hi = WINDOW
    notices = [rng.random() < notice_fraction for _ in events]
    if len(events) >= 2 and len(set(notices)) == 1:
        notices[-1] = not notices[-1]
    schedule = []
    for index, ((t, count), notice) in enumerate(zip(events, notices, strict=True)):
        fraction = (lo + hi) / 2 if len(events) == 1 else lo + (hi - lo) * t / last
        schedule.append(Preemption(index=index, trace_t_s=t, at_fraction=fraction, count=count, with_notice=notice,
                                   victims=_victim_order(rng, dp=dp, pp=pp)))
    return schedule


def max_survivable(*, dp: int, pp: int) -> int:
    """Nodes one event may take with every stage keeping a live copy (dp - 1 per stage)."""
    return max(1, (dp - 1) * pp)


def describe(seconds: float) -> str:
    """`1h 23m` / `4m 05s` / `12s`."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"
