"""Market reads: price in force, downsampled history, cheapest pools."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from controlplane.market.selectors import cheapest_pools, spot_price_at, spot_price_history
from tests.controlplane.factories import make_instance_type, make_spot_prices, make_zone

pytestmark = pytest.mark.django_db
T0 = datetime(2022, 5, 31, 12, 0, tzinfo=UTC)


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def pool():
    itype, zone = make_instance_type("p3.2xlarge", "3.06"), make_zone()
    # Three changes in the first hour, one in the second, two in the fourth.
    make_spot_prices(itype, zone, [(m(0), "1.0"), (m(10), "2.0"), (m(50), "3.0"), (m(70), "1.5"),
                                   (m(185), "0.5"), (m(200), "0.7")])
    make_spot_prices(itype, zone, [(m(5), "9.9")], product="Windows")  # another product: ignored
    return itype, zone


def test_price_at_is_the_last_change_at_or_before(pool):
    itype, zone = pool
    assert spot_price_at(instance_type=itype, zone=zone, at=m(-1)) is None
    assert spot_price_at(instance_type=itype, zone=zone, at=m(0)) == Decimal("1.0")
    assert spot_price_at(instance_type=itype, zone=zone, at=m(9.99)) == Decimal("1.0")
    assert spot_price_at(instance_type=itype, zone=zone, at=m(10)) == Decimal("2.0")
    assert spot_price_at(instance_type=itype, zone=zone, at=m(10_000)) == Decimal("0.7")


def test_raw_history_in_range(pool):
    itype, zone = pool
    points = spot_price_history(instance_type=itype, zone=zone, start=m(10), end=m(185))
    assert [(p.at, p.price) for p in points] == [(m(10), Decimal("2.0")), (m(50), Decimal("3.0")),
                                                 (m(70), Decimal("1.5"))]


def test_downsampled_history_groups_by_aligned_bucket(pool):
    itype, zone = pool
    points = spot_price_history(instance_type=itype, zone=zone, bucket_seconds=3600)
    assert [p.at for p in points] == [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=3)]
    first, second, fourth = points
    assert (first.count, first.min, first.max, first.price) == (3, Decimal("1"), Decimal("3"), Decimal("2"))
    assert (second.count, second.price) == (1, Decimal("1.5"))
    assert (fourth.count, fourth.min, fourth.max, fourth.price) == (2, Decimal("0.5"), Decimal("0.7"),
                                                                    Decimal("0.6"))
    # Buckets of 30 minutes split the first hour into two.
    half = spot_price_history(instance_type=itype, zone=zone, start=T0, end=m(60), bucket_seconds=1800)
    assert [(p.at, p.count) for p in half] == [(T0, 2), (m(30), 1)]


def test_cheapest_pools_use_the_price_in_force(pool):
    itype, zone = pool
    other_zone = make_zone("us-east-1b", "use1-az6")
    make_spot_prices(itype, other_zone, [(m(0), "0.9"), (m(100), "5.0")])
    g4 = make_instance_type("g4dn.xlarge", "0.526")
    make_spot_prices(g4, zone, [(m(0), "0.2")])

    at_60 = cheapest_pools(at=m(60))
    assert [(p.instance_type, p.zone, p.price) for p in at_60] == [
        ("g4dn.xlarge", "us-east-1a", Decimal("0.2")), ("p3.2xlarge", "us-east-1b", Decimal("0.9")),
        ("p3.2xlarge", "us-east-1a", Decimal("3.0")),
    ]
    at_300 = cheapest_pools(at=m(300), instance_types=["p3.2xlarge"], limit=1)
    assert [(p.zone, p.price, p.since) for p in at_300] == [("us-east-1a", Decimal("0.7"), m(200))]
    assert at_300[0].savings_pct == ((1 - Decimal("0.7") / Decimal("3.06")) * 100).quantize(Decimal("0.01"))
    assert cheapest_pools(at=m(-1)) == []


def test_cheapest_per_accelerator_leaves_out_cpu_types(pool):
    _, zone = pool
    big = make_instance_type("p3.8xlarge", "12.24")
    big.accelerator_count = 4
    big.save(update_fields=["accelerator_count"])
    cpu = make_instance_type("c5.4xlarge", "0.68")
    cpu.accelerator_count = 0
    cpu.save(update_fields=["accelerator_count"])
    make_spot_prices(big, zone, [(m(0), "2.0")])  # 0.5 per GPU, cheaper per GPU than p3.2xlarge at 1.0
    make_spot_prices(cpu, zone, [(m(0), "0.1")])
    pools = cheapest_pools(at=m(5), per_accelerator=True)
    assert [(p.instance_type, p.price) for p in pools] == [("p3.8xlarge", Decimal("2.0")),
                                                          ("p3.2xlarge", Decimal("1.0"))]


def test_history_limit_and_empty_range(pool):
    itype, zone = pool
    assert len(spot_price_history(instance_type=itype, zone=zone, limit=2)) == 2
    assert spot_price_history(instance_type=itype, zone=zone, start=m(1000)) == []
    with pytest.raises(ValueError):
        spot_price_history(instance_type=itype, zone=zone, bucket_seconds=-5)
