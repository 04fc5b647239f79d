"""Price series: a piecewise-constant USD/hour price, integrated over node-count series."""

from __future__ import annotations

import gzip
import itertools
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np


@dataclass(slots=True)
class PriceSeries:
    """USD per node-hour, `prices[i]` in force from `times_s[i]` (the first price also before it)."""

    times_s: np.ndarray
    prices: np.ndarray

    @classmethod
    def constant(cls, usd_per_hour: float) -> PriceSeries:
        return cls(np.array([0.0]), np.array([float(usd_per_hour)]))

    @classmethod
    def from_points(cls, points: list[tuple[float, float]]) -> PriceSeries:
        if not points:
            raise ValueError("a price series needs at least one (time, price) point")
        points = sorted(points)
        return cls(np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float))

    def at(self, t_s: float) -> float:
        i = int(np.searchsorted(self.times_s, t_s, side="right")) - 1
        return float(self.prices[max(i, 0)])

    def cost_of_nodes(self, series: list[tuple[float, int]], end_s: float, *, start_s: float = 0.0) -> float:
        """Dollars for a node-count step series [(time, nodes from then on)] up to `end_s`."""
        cuts = sorted({start_s, end_s, *[t for t, _ in series], *[t for t in self.times_s if start_s < t < end_s]})
        cuts = [c for c in cuts if start_s <= c <= end_s]
        ts = np.array([t for t, _ in series])
        ns = np.array([n for _, n in series], dtype=float)
        total = 0.0
        for a, b in itertools.pairwise(cuts):
            i = int(np.searchsorted(ts, a, side="right")) - 1
            nodes = ns[i] if i >= 0 else 0.0
            total += nodes * self.at(a) * (b - a) / 3600.0
        return total


def load_price_series(
    path: Path | str, *, instance_type: str, zone: str | None = None, product: str = "Linux/UNIX"
) -> tuple[PriceSeries, dict]:
    """A pool's spot price history from a `describe_spot_price_history`-style TSV (.tsv or .tsv.gz:
    zone ID, instance type, product, price, ISO timestamp), with times relative to its first change.

    Without `zone`, the zone with the most changes (then the lowest first price) is used. Returns the
    series and what was picked."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    by_zone: dict[str, list[tuple[datetime, float]]] = {}
    with opener(path, "rt") as fh:
        for number, line in enumerate(fh, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 5:
                raise ValueError(f"{path.name}:{number}: expected 5 tab-separated fields, got {len(parts)}")
            zid, itype, prod, price, stamp = parts
            if itype != instance_type or prod != product or (zone and zid != zone):
                continue
            by_zone.setdefault(zid, []).append((datetime.fromisoformat(stamp), float(price)))
    if not by_zone:
        raise ValueError(f"{path.name}: no {product} prices for {instance_type}" + (f" in {zone}" if zone else ""))
    picked = zone or min(by_zone, key=lambda z: (-len(by_zone[z]), min(by_zone[z])[1], z))
    points = sorted(by_zone[picked])
    start = points[0][0]
    series = PriceSeries.from_points([((t - start).total_seconds(), p) for t, p in points])
    return series, {"instance_type": instance_type, "zone": picked, "changes": len(points), "start": start.isoformat()}
