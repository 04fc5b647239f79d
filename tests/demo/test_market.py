"""The bundled synthetic market: deterministic by seed, and calibrated to the real price file."""

from __future__ import annotations

import gzip
import itertools
import math
import statistics
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from spotpipe.demo import market

END = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _pools(points):
    pools = defaultdict(list)
    for p in points:
        pools[(p.instance_type, p.zone)].append(p)
    return pools


def test_same_seed_same_history_and_overlapping_windows_agree():
    first = list(market.synthetic_history(seed=7, end=END))
    assert first == list(market.synthetic_history(seed=7, end=END))
    assert first != list(market.synthetic_history(seed=8, end=END))
    # A demo run a day later extends the history: the prices at the same instants are the same.
    later = {(p.instance_type, p.zone, p.timestamp): p.price
             for p in market.synthetic_history(seed=7, end=END + timedelta(days=1))}
    shared = [p for p in first if (p.instance_type, p.zone, p.timestamp) in later]
    assert len(shared) > len(first) // 2
    assert all(later[(p.instance_type, p.zone, p.timestamp)] == p.price for p in shared)


def test_every_pool_has_a_price_in_force_over_the_whole_window():
    pools = _pools(market.synthetic_history(seed=0, end=END, days=3))
    assert len(pools) == len(market.DEMO_TYPES) * len(market.DEMO_ZONES)
    for series in pools.values():
        assert series[0].timestamp <= END - timedelta(days=3)
        assert all(a.timestamp < b.timestamp for a, b in itertools.pairwise(series))
        assert all(p.timestamp <= END for p in series)


def test_generated_prices_follow_the_calibration():
    on_demand = dict(market.DEMO_TYPES)
    ratios, steps, ups, gaps = [], [], 0, []
    for seed in range(5):
        for (itype, _zone), series in _pools(market.synthetic_history(seed=seed, end=END, days=60)).items():
            ratios += [float(p.price) / on_demand[itype] for p in series]
            for a, b in itertools.pairwise(series):
                step = float(b.price) / float(a.price) - 1
                steps.append(abs(step))
                ups += step > 0
                gaps.append((b.timestamp - a.timestamp).total_seconds() / 3600)
    assert min(ratios) >= market.SPOT_TO_ON_DEMAND_FLOOR - 1e-3
    assert 0.30 <= statistics.median(ratios) <= 0.36
    assert max(ratios) < 0.45
    # Steps: the file's median |step| of 0.24% (prices are rounded to 0.0001 USD, which shifts small ones).
    assert 0.0015 <= statistics.median(steps) <= 0.0040
    assert 0.45 <= ups / len(steps) <= 0.65
    # A change every 3.26 h on average (equal prices after rounding merge two changes into one gap).
    assert 3.0 <= statistics.mean(gaps) <= 4.5


def test_calibration_constants_match_the_reference_file(shared_data):
    """Re-measure the figures the generator is calibrated on from the real price history."""
    pools = defaultdict(list)
    with gzip.open(shared_data / "prices" / "aws-spot-prices-2022-05.tsv.gz", "rt") as handle:
        for line in handle:
            zone, itype, product, price, ts = line.rstrip("\n").split("\t")
            if product == "Linux/UNIX":
                pools[(itype, zone)].append((datetime.fromisoformat(ts), float(price)))
    moving = [sorted(v) for v in pools.values() if len(v) >= 2]
    steps = [b[1] / a[1] - 1 for v in moving for a, b in itertools.pairwise(v)]
    gaps = [(b[0] - a[0]).total_seconds() / 3600 for v in moving for a, b in itertools.pairwise(v)]
    assert math.isclose(statistics.median(abs(s) for s in steps), market.MEDIAN_ABS_STEP, rel_tol=0.05)
    assert math.isclose(sum(s > 0 for s in steps) / len(steps), market.UP_FRACTION, abs_tol=0.01)
    assert math.isclose(statistics.mean(gaps), market.MEAN_HOURS_BETWEEN_CHANGES, rel_tol=0.02)
    # The level: spot / on-demand in us-east-1 (the file has no us-east-1 row for some types).
    measured = 0
    for itype, on_demand in market.DEMO_TYPES:
        prices = [p for (t, z), v in pools.items() if t == itype and z.startswith("use1") for _, p in v]
        if prices:
            measured += 1
            ratio = statistics.median(prices) / on_demand
            assert market.SPOT_TO_ON_DEMAND_FLOOR - 0.01 <= ratio <= 0.36, (itype, ratio)
    assert measured >= 2
