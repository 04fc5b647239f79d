"""Generate the bundled synthetic spot capacity traces and their price history (seeded: the same
files every run).

    .venv/bin/python -m runtime.sim.data.generate_capacity_traces

Writes, beside this file, one availability-count trace per region (SkyPilot's count JSON shape,
`"format": "availability-count"` in its metadata: one tick a minute, each the p3.2xlarge nodes of a
16-node pool the region would give) and one spot price TSV for both regions (the columns of
`describe_spot_price_history`, read by `runtime.sim.prices.load_price_series`).

Capacity is a three-state regime process, because GPU spot capacity comes and goes in spells rather
than as independent noise:

* open: the pool is (nearly) full; a node or two missing for a few minutes now and then.
* tight: a fraction of the pool (4-12 nodes), drifting.
* drought: 0-3 nodes, for a log-normal time (median tens of minutes to hours, 10 min to 6 h).

An open spell ends more often in the region's busy hours (its working day, UTC) than at night.
The second region differs on purpose: shorter calm spells and short tight spells, but rarer droughts
that last longer, busy three hours later (the west coast's day).

Prices follow the product's synthetic market (`spotpipe.demo.history.price_rows`): a mean-reverting
random walk per pool between 25% and 90% of on-demand around 40%, here one change an hour.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).parent
START = datetime.fromisoformat("2026-01-05T00:00:00+00:00")  # a Monday
HOURS = 96
GAP_S = 60
POOL = 16
INSTANCE_TYPE = "p3.2xlarge"
ON_DEMAND_USD_PER_HOUR = 3.06  # runtime/planner/data/instance_types.json
PRICES_FILE = "spot-prices-p3.2xlarge.tsv"


@dataclass(frozen=True, slots=True)
class RegionPattern:
    region: str
    zone_id: str
    seed: int
    open_mean_h: float
    """Mean length of a calm spell outside busy hours."""
    tight_mean_h: float
    drought_median_h: float
    drought_sigma: float
    """Spread of the log-normal drought length."""
    drought_after_open: float
    """Chance that a calm spell ends in a drought rather than a tight spell."""
    busy_utc: tuple[int, int]
    """Busy hours [start, end) in UTC (end may pass midnight)."""
    busy_factor: float
    """How much likelier a calm spell is to end in a busy hour."""


REGIONS = (
    RegionPattern("us-east-1", "use1-az1", seed=1, open_mean_h=3.0, tight_mean_h=0.75, drought_median_h=0.8,
                  drought_sigma=0.8, drought_after_open=0.35, busy_utc=(13, 22), busy_factor=2.5),
    RegionPattern("us-west-2", "usw2-az1", seed=2, open_mean_h=2.0, tight_mean_h=0.3, drought_median_h=1.5,
                  drought_sigma=0.6, drought_after_open=0.15, busy_utc=(16, 25), busy_factor=1.5),
)


def _busy(pattern: RegionPattern, tick: int) -> bool:
    hour = (tick * GAP_S // 3600) % 24
    start, end = pattern.busy_utc
    return start <= hour < end or start <= hour + 24 < end


def availability(pattern: RegionPattern) -> list[int]:
    """Nodes available each tick over `HOURS`."""
    rng = random.Random(pattern.seed)
    ticks = HOURS * 3600 // GAP_S
    per_h = 3600 / GAP_S
    out: list[int] = []
    state, left, level, target = "open", 0, POOL, POOL
    for tick in range(ticks):
        if state == "open":
            # A calm spell has no fixed length: it ends with a per-tick hazard, higher in busy hours.
            hazard = (pattern.busy_factor if _busy(pattern, tick) else 1.0) / (pattern.open_mean_h * per_h)
            if tick > 0 and rng.random() < hazard:
                state = "drought" if rng.random() < pattern.drought_after_open else "tight"
                left = 0
            else:
                missing = POOL - level
                if missing < 3 and rng.random() < 0.004:
                    level -= 1
                elif missing > 0 and rng.random() < 0.08:
                    level += 1
        if state != "open" and left == 0:
            if state == "tight":
                left = max(5, round(rng.expovariate(1 / (pattern.tight_mean_h * per_h))))
                target = rng.randint(4, 12)
            else:
                hours = math.exp(rng.gauss(math.log(pattern.drought_median_h), pattern.drought_sigma))
                left = round(min(max(hours, 1 / 6), 6.0) * per_h)
                target = rng.randint(0, 3)
        if state != "open":
            # Capacity drains and refills over minutes, not in one tick.
            if level != target and rng.random() < 0.5:
                level += 1 if target > level else -1
            if state == "tight" and rng.random() < 0.05:
                target = min(12, max(4, target + rng.choice((-2, -1, 1, 2))))
            left -= 1
            if left == 0:
                after_tight = "drought" if rng.random() < 0.3 else "open"
                state = after_tight if state == "tight" else rng.choice(("tight", "open"))
                target = POOL if state == "open" else target
        if state == "open" and level < POOL - 3:
            level += 1  # the pool refills after a spell, a node a minute
        out.append(level)
    return out


def prices(pattern: RegionPattern) -> list[tuple[datetime, float]]:
    """(time, USD/hour) one change an hour: `spotpipe.demo.history.price_rows`'s walk."""
    rng = random.Random(1000 + pattern.seed)
    level = rng.uniform(0.3, 0.5)
    out = []
    for hour in range(HOURS):
        level += 0.08 * (0.4 - level) + rng.gauss(0, 0.01)
        level = min(max(level, 0.25), 0.9)
        out.append((START + timedelta(hours=hour), round(ON_DEMAND_USD_PER_HOUR * level, 4)))
    return out


def trace_name(pattern: RegionPattern) -> str:
    return f"availability-{INSTANCE_TYPE}-{POOL}node-{pattern.region}.json"


def main() -> None:
    rows = []
    for pattern in REGIONS:
        meta = {
            "format": "availability-count",
            "gap_seconds": GAP_S,
            "region": pattern.region,
            "zone_id": pattern.zone_id,
            "instance_type": INSTANCE_TYPE,
            "pool_nodes": POOL,
            "start": START.isoformat(),
            "synthetic": f"runtime/sim/data/generate_capacity_traces.py, seed {pattern.seed}",
        }
        doc = {"metadata": meta, "data": availability(pattern)}
        (HERE / trace_name(pattern)).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        rows += [f"{pattern.zone_id}\t{INSTANCE_TYPE}\tLinux/UNIX\t{price:.4f}\t{at.isoformat()}"
                 for at, price in prices(pattern)]
    (HERE / PRICES_FILE).write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
