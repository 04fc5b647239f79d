"""Shared output helpers for benchmarks: tables on stdout, progress on stderr."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from typing import Any

from spotpipe.tables import print_table

__all__ = ["Progress", "growth_exponent", "percentile", "print_table"]


class Progress:
    """A one-line progress indicator on stderr (quiet when stderr is not a terminal)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.started = time.monotonic()

    def step(self, message: str, done: int | None = None, total: int | None = None) -> None:
        elapsed = time.monotonic() - self.started
        counter = f" [{done}/{total}]" if done is not None and total else ""
        line = f"[{elapsed:6.1f}s]{counter} {message}"
        if self.stream.isatty():
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()


def growth_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(time) on log(size): how a cost grows with nodes, rows, ..."""
    if len(points) < 2:
        return None
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(max(t, 1e-6)) for _, t in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (0 < q <= 100) of `values`, one of them; None for none.
    (Some older benchmarks keep their own rank rule, stated in their docs.)"""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


LOOP_ITERATIONS = 400_000
LOOP_REPEATS = 5


def machine_reference() -> dict[str, Any]:
    """How fast this machine runs plain Python right now, so that figures from different machines
    or sessions are compared only where this is alike: the same loop (`total += i` in a function),
    the fastest of a few repeats (the others carry whatever else ran), beside the core count and the
    load. Sessions' machines have differed by about 2x (docs/reliability.md, CI's time)."""
    fastest = math.inf
    for _ in range(LOOP_REPEATS):
        started = time.perf_counter()
        total = 0
        for i in range(LOOP_ITERATIONS):
            total += i
        fastest = min(fastest, time.perf_counter() - started)
    return {
        "python_loop_ns_per_iteration": round(fastest / LOOP_ITERATIONS * 1e9, 1),
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
