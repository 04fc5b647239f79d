"""A synthetic preemption trace generator calibrated on the public GPU spot traces.

Preemption *events* arrive as a Poisson process; each event takes a burst of nodes (1 + a geometric
number, so the mean burst is `mean_burst`), as the AWS and GCP traces show (2.1 and 4.3 nodes per
event). Each lost node is replaced after `replacement_delay_s` (exponentially distributed around that
mean) when `replace` is on. Rates in the public traces: 0.10 (GCP A100) to 0.61 (AWS p3) preemptions
per node-hour. The same seed gives the same trace.
"""

from __future__ import annotations

import numpy as np

from runtime.traces import ADD, REMOVE, Trace, TraceEvent


def synthetic_trace(
    *,
    nodes: int,
    hours: float,
    rate_per_node_hour: float = 0.3,
    mean_burst: float = 2.0,
    replacement_delay_s: float = 600.0,
    replace: bool = True,
    seed: int = 0,
) -> Trace:
    """A bursty preemption trace for a cluster that starts with `nodes` nodes."""
    if nodes < 1 or hours <= 0:
        raise ValueError(f"nodes={nodes} and hours={hours} must be positive")
    if rate_per_node_hour < 0 or mean_burst < 1:
        raise ValueError(f"rate_per_node_hour={rate_per_node_hour} must be >= 0 and mean_burst={mean_burst} >= 1")
    rng = np.random.default_rng(seed)
    duration = hours * 3600.0
    events = [TraceEvent(0.0, ADD, f"node{i}") for i in range(nodes)]
    live = [f"node{i}" for i in range(nodes)]
    serial = nodes
    pending: list[tuple[float, str]] = []  # (arrival time, name) of replacements
    # Event rate is per node: thinning by live/nodes keeps the per-node-hour rate right as the
    # cluster shrinks and grows.
    event_rate = rate_per_node_hour * nodes / mean_burst / 3600.0
    t = 0.0
    p_more = 1.0 - 1.0 / mean_burst
    while event_rate > 0:
        t += rng.exponential(1.0 / event_rate)
        if t >= duration:
            break
        # Apply replacements that arrived before this event.
        pending.sort()
        while pending and pending[0][0] <= t:
            at, name = pending.pop(0)
            live.append(name)
            events.append(TraceEvent(at, ADD, name))
        if rng.random() >= len(live) / nodes:
            continue
        burst = 1 + (rng.geometric(1.0 - p_more) - 1 if p_more > 0 else 0)
        burst = min(burst, len(live))
        for _ in range(burst):
            victim = live.pop(int(rng.integers(len(live))))
            events.append(TraceEvent(t, REMOVE, victim))
            if replace:
                serial += 1
                delay = rng.exponential(replacement_delay_s) if replacement_delay_s > 0 else 0.0
                pending.append((t + delay, f"node{serial}"))
    for at, name in sorted(pending):
        if at < duration:
            events.append(TraceEvent(at, ADD, name))
    return Trace(
        name=f"synthetic-{nodes}n-{hours:g}h-r{rate_per_node_hour:g}-b{mean_burst:g}-s{seed}",
        events=events,
        duration_s=duration,
        meta={
            "format": "synthetic",
            "nodes": nodes,
            "rate_per_node_hour": rate_per_node_hour,
            "mean_burst": mean_burst,
            "replacement_delay_s": replacement_delay_s,
            "seed": seed,
        },
    )
