"""The billing ledger: segments priced by the spot price in force, split at price changes, with
no gaps and no overlaps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest

from controlplane.billing.models import BillingSegment, PriceSource
from controlplane.billing.services import (
    billing_backfill,
    billing_close,
    billing_open,
    billing_reprice,
    billing_reprice_open_segments,
)
from controlplane.common.errors import Conflict
from controlplane.fleet.models import Lifecycle
from tests.controlplane.factories import (
    make_instance,
    make_instance_type,
    make_job,
    make_spot_prices,
    make_team,
    make_zone,
)

pytestmark = pytest.mark.django_db
T0 = datetime(2022, 5, 31, 12, 0, tzinfo=UTC)


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def assert_contiguous(segments: list[BillingSegment], start: datetime, end: datetime | None) -> None:
    """Segments cover [start, end) exactly: first starts at start, each starts where the previous
    ended, the last ends at end."""
    assert segments, "no segments"
    assert segments[0].start == start
    for before, after in pairwise(segments):
        assert before.end == after.start, f"gap or overlap between {before} and {after}"
        assert before.start < before.end
    assert segments[-1].end == end


@pytest.fixture
def pool():
    itype, zone = make_instance_type("p3.2xlarge", on_demand="3.06"), make_zone()
    make_spot_prices(itype, zone, [(h(-5), "0.9180"), (h(2), "1.2000"), (h(3), "1.2000"), (h(5), "0.9500")])
    return itype, zone


def test_open_prices_by_spot_in_force_and_close_ends_it(pool):
    itype, zone = pool
    instance = make_instance(make_team(), instance_type=itype, zone=zone)
    segment = billing_open(instance=instance, at=h(1))
    assert (segment.price_per_hour, segment.price_source) == (Decimal("0.918"), PriceSource.SPOT)
    assert segment.on_demand_price_per_hour == Decimal("3.06")
    assert billing_open(instance=instance, at=h(1.5)).pk == segment.pk  # idempotent: still one open
    closed = billing_close(instance=instance, at=h(1.75))
    assert closed.end == h(1.75)
    assert billing_close(instance=instance, at=h(2)) is None  # nothing left open
    with pytest.raises(Conflict):
        billing_open(instance=instance, at=h(1.5))  # would overlap the closed segment


def test_on_demand_and_unknown_prices(pool):
    itype, zone = pool
    team = make_team()
    on_demand = billing_open(instance=make_instance(team, instance_type=itype, zone=zone,
                                                    lifecycle=Lifecycle.ON_DEMAND), at=h(1))
    assert (on_demand.price_per_hour, on_demand.price_source) == (Decimal("3.06"), PriceSource.ON_DEMAND)
    too_early = billing_open(instance=make_instance(team, instance_type=itype, zone=zone), at=h(-10))
    assert (too_early.price_per_hour, too_early.price_source) == (Decimal(0), PriceSource.FALLBACK)


def test_reprice_splits_open_segments_of_the_pool_only(pool):
    itype, zone = pool
    team = make_team()
    job = make_job(team)
    inside = make_instance(team, job=job, instance_type=itype, zone=zone)
    other_zone = make_instance(team, instance_type=itype, zone=make_zone("us-east-1b", "use1-az6"))
    billing_open(instance=inside, at=h(1))
    billing_open(instance=other_zone, at=h(1))

    assert billing_reprice(instance_type=itype, zone=zone, at=h(2)) == 1
    assert billing_reprice(instance_type=itype, zone=zone, at=h(2)) == 0  # applying twice is a no-op
    assert billing_reprice(instance_type=itype, zone=zone, at=h(3)) == 0  # same price: no split
    assert billing_reprice(instance_type=itype, zone=zone, at=h(5)) == 1
    billing_close(instance=inside, at=h(6))

    segments = list(BillingSegment.objects.filter(instance=inside).order_by("start"))
    assert_contiguous(segments, h(1), h(6))
    assert [s.price_per_hour for s in segments] == [Decimal("0.918"), Decimal("1.2"), Decimal("0.95")]
    assert all(s.job_id == job.pk and s.team_id == team.pk for s in segments)
    assert BillingSegment.objects.filter(instance=other_zone).count() == 1


def test_backfill_splits_at_every_change_without_gaps(pool):
    itype, zone = pool
    instance = make_instance(make_team(), instance_type=itype, zone=zone, running_at=h(1), ended_at=h(6),
                             state="terminated")
    segments = billing_backfill(instance=instance)
    stored = list(BillingSegment.objects.filter(instance=instance).order_by("start"))
    assert len(stored) == len(segments) == 3  # 0.918 -> 1.2 (h2; the h3 "change" keeps 1.2) -> 0.95 (h5)
    assert_contiguous(stored, h(1), h(6))
    assert [(s.start, s.price_per_hour) for s in stored] == [
        (h(1), Decimal("0.918")), (h(2), Decimal("1.2")), (h(5), Decimal("0.95"))
    ]
    # Rebuilding replaces, never duplicates.
    billing_backfill(instance=instance)
    assert BillingSegment.objects.filter(instance=instance).count() == 3


def test_backfill_of_a_live_instance_leaves_the_last_segment_open(pool):
    itype, zone = pool
    instance = make_instance(make_team(), instance_type=itype, zone=zone, running_at=h(4), state="running")
    billing_backfill(instance=instance)
    stored = list(BillingSegment.objects.filter(instance=instance).order_by("start"))
    assert_contiguous(stored, h(4), None)
    assert [s.price_per_hour for s in stored] == [Decimal("1.2"), Decimal("0.95")]


def test_reprice_open_segments_after_new_prices_arrive():
    itype, zone = make_instance_type("g5.xlarge", on_demand="1.006"), make_zone()
    team = make_team()
    early = make_instance(team, instance_type=itype, zone=zone)
    billing_open(instance=early, at=h(0))  # no price known yet: fallback 0
    make_spot_prices(itype, zone, [(h(-1), "0.40"), (h(1), "0.45"), (h(2), "0.45"), (h(3), "0.50"), (h(9), "0.9")])

    assert billing_reprice_open_segments(until=h(4)) == 3  # priced, then split at h1 and h3
    assert billing_reprice_open_segments(until=h(4)) == 0  # idempotent
    segments = list(BillingSegment.objects.filter(instance=early).order_by("start"))
    assert_contiguous(segments, h(0), None)
    assert [(s.start, s.price_per_hour, s.price_source) for s in segments] == [
        (h(0), Decimal("0.4"), PriceSource.SPOT), (h(1), Decimal("0.45"), PriceSource.SPOT),
        (h(3), Decimal("0.5"), PriceSource.SPOT),
    ]
