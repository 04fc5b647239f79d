"""The demo's bundled synthetic spot market: a few us-east-1 GPU pools with a price history that is
deterministic by seed and calibrated to real AWS spot data.

Calibration (measured on the reference file `prices/aws-spot-prices-2022-05.tsv.gz`, Linux/UNIX
rows, 9,100 pools, 5.65 h; `tests/demo/test_market.py` re-measures it when the file is present):

- level: the median spot price of a GPU type in us-east-1 is 0.30-0.35 of its on-demand price
  (0.30 is AWS's floor for most types: g4dn, g5.2xlarge, p3.2xlarge, p4d; g5.xlarge 0.341,
  g4dn.12xlarge 0.353), with a spread across zones of 0-16% (coefficient of variation);
- moves: most pools did not move at all in the file; among the 179 that did, the mean time between
  two changes was 3.26 h, the relative step |p'/p - 1| had a median of 0.24% and a 90th
  percentile of 0.84%, and 57% of steps went up.

The generator draws each pool's start level from that band, then changes as a Poisson process
with the measured mean gap, each step a Laplace draw scaled to the measured median (so a demo
chart shows the small real moves rather than flat lines), never below the 0.30 floor.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from controlplane.market.local_pool import LOCAL_STAND_IN_TYPE

# Measured on the reference file (see the module docstring).
SPOT_TO_ON_DEMAND_FLOOR = 0.30
SPOT_TO_ON_DEMAND_MEDIAN = 0.33
ZONE_SPREAD_CV = 0.08
MEAN_HOURS_BETWEEN_CHANGES = 3.26
MEDIAN_ABS_STEP = 0.0024
UP_FRACTION = 0.57
# Pull towards the pool's level (not measured: a 5.65 h file cannot show it; chosen so that a year of
# steps stays within a few percent of the level, as the file's spread across zones does).
REVERSION = 5.0

LINUX = "Linux/UNIX"
# (instance type, on-demand USD/h as in the bundled catalogue) and the us-east-1 zone IDs used.
DEMO_TYPES: tuple[tuple[str, float], ...] = (("g4dn.xlarge", 0.526), ("g5.xlarge", 1.006), ("p3.2xlarge", 3.06))
DEMO_ZONES: tuple[str, ...] = ("use1-az4", "use1-az6", "use1-az1")
# The local nodes of the demo stand in for this type: their pool is priced by its cheapest zone.
STAND_IN_TYPE = LOCAL_STAND_IN_TYPE
# Every pool's series starts here (a fixed instant, so histories agree across runs).
ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PricePoint:
    """One price change of a pool (the fields of a price file row)."""

    zone: str
    instance_type: str
    price: Decimal
    timestamp: datetime


def _laplace(rng: random.Random, median_abs: float) -> float:
    """|X| of a Laplace(0, b) has median b ln 2: scale so the median step is `median_abs`."""
    scale = median_abs / math.log(2)
    return rng.expovariate(1 / scale)


def pool_series(*, rng: random.Random, instance_type: str, on_demand: float, zone: str, start: datetime,
                end: datetime) -> list[PricePoint]:
    """One pool's price changes from `start` to `end` (the first point at `start`)."""
    target = on_demand * max(SPOT_TO_ON_DEMAND_FLOOR, rng.gauss(SPOT_TO_ON_DEMAND_MEDIAN, SPOT_TO_ON_DEMAND_MEDIAN
                                                                * ZONE_SPREAD_CV))
    level = target
    floor = on_demand * SPOT_TO_ON_DEMAND_FLOOR
    points = [PricePoint(zone=zone, instance_type=instance_type, price=_usd(level), timestamp=start)]
    t = start
    while True:
        t += timedelta(hours=rng.expovariate(1 / MEAN_HOURS_BETWEEN_CHANGES))
        if t >= end:
            break
        step = _laplace(rng, MEDIAN_ABS_STEP)
        # Up with the measured frequency at the pool's own level, less often the higher the price has
        # drifted above it (and more often below): months of steps stay in the measured band.
        p_up = min(1.0, max(0.0, UP_FRACTION - REVERSION * math.log(level / target)))
        level = max(floor, level * (1 + step if rng.random() < p_up else 1 - step))
        price = _usd(level)
        if price != points[-1].price:
            points.append(PricePoint(zone=zone, instance_type=instance_type, price=price, timestamp=t))
    return points


def _usd(value: float) -> Decimal:
    return Decimal(str(round(value, 4)))


def synthetic_history(*, seed: int, end: datetime, days: float = 3.0,
                      types: tuple[tuple[str, float], ...] = DEMO_TYPES,
                      zones: tuple[str, ...] = DEMO_ZONES) -> Iterator[PricePoint]:
    """The price changes of every (type, zone) pool in the `days` before `end`, plus the change in
    force when that window opens. Each pool's series runs from a fixed origin (ORIGIN) with its own
    seeded generator, so the same seed gives the same prices at the same instants whenever it is
    run: a second demo a day later extends the history instead of contradicting it."""
    end = end.replace(microsecond=0)
    window_start = end - timedelta(days=days)
    for instance_type, on_demand in types:
        for zone in zones:
            rng = random.Random(f"{seed}:{instance_type}:{zone}")
            series = pool_series(rng=rng, instance_type=instance_type, on_demand=on_demand, zone=zone,
                                 start=min(ORIGIN, window_start), end=end)
            before = [p for p in series if p.timestamp <= window_start]
            yield from before[-1:]
            yield from (p for p in series if p.timestamp > window_start)
