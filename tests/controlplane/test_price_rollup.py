"""The hourly price roll-up agrees with aggregating the raw price table, folds late (back-filled)
rows into the right hours exactly once, and serves the long-range price charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from controlplane.accounts.models import Role
from controlplane.market import rollup
from controlplane.market.models import PriceHour, SpotPrice
from controlplane.market.selectors import spot_price_history
from spotpipe.demo import history as demo_history
from tests.controlplane.factories import make_team, make_user

pytestmark = pytest.mark.django_db

END = datetime(2026, 3, 1, tzinfo=UTC)
START = END - timedelta(days=10)


@pytest.fixture
def pools():
    pools = demo_history.ensure_market(pools=2)
    demo_history.load_prices(demo_history.price_rows(pools=pools, start=START, end=END, changes_per_pool=700))
    return pools


def _raw(pool, bucket: int) -> list[tuple]:
    return [(p.at, p.price, p.min, p.max, p.count) for p in spot_price_history(
        instance_type=pool.instance_type.pk, zone=pool.zone.pk, start=START, end=END, bucket_seconds=bucket)]


def _rolled(pool, bucket: int) -> list[tuple]:
    key = (pool.instance_type.pk, pool.zone.pk)
    return rollup.hourly_buckets(pools=[key], product="Linux/UNIX", start=START, end=END, bucket_seconds=bucket)[key]


@pytest.mark.parametrize("bucket", [3600, 6 * 3600, 86400])
def test_rollup_matches_the_raw_aggregation(pools, bucket):
    assert rollup.price_rollup_refresh() == 1400
    for pool in pools:
        raw, rolled = _raw(pool, bucket), _rolled(pool, bucket)
        assert [r[0] for r in rolled] == [r[0] for r in raw]
        assert [r[4] for r in rolled] == [r[4] for r in raw]
        assert [(r[2], r[3]) for r in rolled] == [(r[2], r[3]) for r in raw]
        # Means: exact decimal sums here, float averages in the database; equal to the micro-dollar.
        assert all(abs(a[1] - b[1]) <= Decimal("0.000001") for a, b in zip(rolled, raw, strict=True))


def test_refresh_folds_each_row_once_and_late_rows_into_their_hours(pools):
    rollup.price_rollup_refresh()
    assert rollup.price_rollup_refresh() == 0  # nothing new: a no-op
    assert not rollup.price_rollup_pending()
    pool = pools[0]
    hour = datetime(2026, 2, 25, 7, tzinfo=UTC)
    before = PriceHour.objects.get(instance_type=pool.instance_type, zone=pool.zone, hour=hour)
    # A back-filled change inside an hour already rolled up, and a spike that sets a new high.
    SpotPrice.objects.create(instance_type=pool.instance_type, zone=pool.zone, price=Decimal("9.5"),
                             timestamp=hour + timedelta(minutes=59, seconds=59))
    assert rollup.price_rollup_pending()
    assert rollup.price_rollup_refresh() == 1
    after = PriceHour.objects.get(instance_type=pool.instance_type, zone=pool.zone, hour=hour)
    assert after.changes == before.changes + 1
    assert after.total == before.total + Decimal("9.5") and after.high == Decimal("9.5")
    assert after.low == before.low
    assert sum(PriceHour.objects.values_list("changes", flat=True)) == SpotPrice.objects.count()
    assert rollup.price_rollup_rebuild() == SpotPrice.objects.count()


def test_long_range_price_chart_reads_the_rollup(client, pools):
    team = make_team("gamma")
    client.force_login(make_user(team, role=Role.ADMIN))
    # The price history ends on END, in the past: ask for a window long enough to contain it.
    data = client.get(reverse("frontend:prices-data"), {"days": "365"}).json()
    assert data["source"] == "hourly roll-up" and data["bucket_seconds"] == 86400
    assert sum(s["changes"] for s in data["series"]) == 1400
    short = client.get(reverse("frontend:prices-data"), {"days": "1"}).json()
    assert short["source"] == "price table" and short["bucket_seconds"] == 300


def test_the_periodic_task_folds_new_prices(pools):
    from controlplane.market.tasks import refresh_price_rollup

    assert refresh_price_rollup.apply().get() == 1400
    assert refresh_price_rollup.apply().get() == 0
