"""Reads on the market: catalogue lists, the price in force, price history (optionally downsampled
in the database) and the cheapest pools at a moment.

Every per-pool query filters on (instance_type, zone, product) and a timestamp range, which is the
leading part of the unique index `spotprice_pool_time_unique`, so it is an index range scan."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import (
    Avg,
    Case,
    Count,
    F,
    FloatField,
    Func,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    When,
)
from django.db.models.functions import Cast

from controlplane.market.models import InstanceType, SpotPool, SpotPrice, Zone

LINUX = "Linux/UNIX"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def instance_type_list() -> QuerySet[InstanceType]:
    """Instance types, by cloud then name (the API's filters narrow it: api/filters.py)."""
    return InstanceType.objects.select_related("cloud").order_by("cloud__code", "name")


def zone_list() -> QuerySet[Zone]:
    """Zones with their region and cloud (the API's filters narrow it: api/filters.py)."""
    return Zone.objects.select_related("region__cloud").order_by("region__cloud__code", "region__code", "code")


def zone_get(*, value: str) -> Zone | None:
    """A zone by zone ID (`use1-az4`) or by code (`us-east-1a`, `local`)."""
    return Zone.objects.filter(zone_id=value).first() or Zone.objects.filter(code=value).order_by("id").first()


def spot_price_at(
    *, instance_type: InstanceType | int, zone: Zone | int, at: datetime, product: str = LINUX
) -> Decimal | None:
    """The spot price in force at `at`: the last change at or before `at`; None when no change is
    known that early."""
    return (
        SpotPrice.objects.filter(instance_type=instance_type, zone=zone, product=product, timestamp__lte=at)
        .order_by("-timestamp")
        .values_list("price", flat=True)
        .first()
    )


def spot_price_changes(
    *, instance_type: InstanceType | int, zone: Zone | int, start: datetime, end: datetime | None,
    product: str = LINUX,
) -> list[tuple[datetime, Decimal]]:
    """Price changes with start < timestamp < end (end None: no bound), in time order."""
    qs = SpotPrice.objects.filter(instance_type=instance_type, zone=zone, product=product, timestamp__gt=start)
    if end is not None:
        qs = qs.filter(timestamp__lt=end)
    return list(qs.order_by("timestamp").values_list("timestamp", "price"))


class EpochSeconds(Func):
    """Seconds since 1970 of a datetime column, as an integer, on SQLite and PostgreSQL."""

    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="CAST(strftime('%%%%s', %(expressions)s) AS INTEGER)",
                           **extra_context)

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="CAST(FLOOR(EXTRACT(EPOCH FROM %(expressions)s)) AS BIGINT)",
                           **extra_context)


@dataclass(frozen=True, slots=True)
class PricePoint:
    """One point of a price chart. For raw history min = max = avg = the price and count = 1."""

    at: datetime
    price: Decimal
    min: Decimal
    max: Decimal
    count: int


def spot_price_history(
    *,
    instance_type: InstanceType | int,
    zone: Zone | int,
    start: datetime | None = None,
    end: datetime | None = None,
    bucket_seconds: int | None = None,
    product: str = LINUX,
    limit: int | None = None,
) -> list[PricePoint]:
    """Price changes of one pool in [start, end), in time order.

    With `bucket_seconds` the database groups changes into buckets aligned on the Unix epoch and
    returns one point per non-empty bucket: `at` is the bucket start, `price` the mean of the
    changes in it (not time-weighted), with their min, max and count. An empty bucket means the
    price did not change: a chart should hold the previous value (step line)."""
    qs = SpotPrice.objects.filter(instance_type=instance_type, zone=zone, product=product)
    if start is not None:
        qs = qs.filter(timestamp__gte=start)
    if end is not None:
        qs = qs.filter(timestamp__lt=end)
    if not bucket_seconds:
        rows = qs.order_by("timestamp").values_list("timestamp", "price")
        if limit is not None:
            rows = rows[:limit]
        return [PricePoint(at=ts, price=p, min=p, max=p, count=1) for ts, p in rows]
    if bucket_seconds <= 0:
        raise ValueError("bucket_seconds must be positive")
    bucketed = (
        qs.annotate(bucket=EpochSeconds("timestamp") / bucket_seconds)
        .values("bucket")
        # Average as float: SQLite has no decimal arithmetic; rounding back to 6 places below.
        .annotate(avg=Avg(Cast("price", FloatField())), low=Min("price"), high=Max("price"), n=Count("id"))
        .order_by("bucket")
    )
    if limit is not None:
        bucketed = bucketed[:limit]
    points = []
    quantum = Decimal("0.000001")
    for row in bucketed:
        at = _EPOCH + timedelta(seconds=int(row["bucket"]) * bucket_seconds)
        points.append(PricePoint(
            at=at, price=Decimal(repr(row["avg"])).quantize(quantum), min=Decimal(row["low"]).quantize(quantum),
            max=Decimal(row["high"]).quantize(quantum), count=row["n"],
        ))
    return points


@dataclass(frozen=True, slots=True)
class Pool:
    """A spot pool (instance type x zone) with the price in force at a moment."""

    instance_type: str
    instance_type_id: int
    zone: str
    zone_id: int
    zone_aws_id: str | None
    region: str
    price: Decimal
    since: datetime
    on_demand_price: Decimal | None
    accelerator_name: str
    accelerator_count: int

    @property
    def savings_pct(self) -> Decimal | None:
        """Discount against on-demand, in percent (None when on-demand is unknown)."""
        if not self.on_demand_price:
            return None
        return ((1 - self.price / self.on_demand_price) * 100).quantize(Decimal("0.01"))


def cheapest_pools(
    *, at: datetime, instance_types: list[str] | None = None, limit: int = 10, product: str = LINUX,
    per_accelerator: bool = False,
) -> list[Pool]:
    """The `limit` cheapest pools by the price in force at `at` (last change at or before `at`).

    Pools come from SpotPool (one row per pool, kept by the loader). A pool's newest change, when
    at or before `at`, is the price in force; otherwise one backward probe of the SpotPrice unique
    index (a correlated subquery) finds it. The cost grows with the number of pools, never with
    the length of the history. `per_accelerator` orders by
    price per accelerator (pools without accelerators are then left out)."""
    in_force = SpotPrice.objects.filter(
        instance_type=OuterRef("instance_type"), zone=OuterRef("zone"), product=OuterRef("product"),
        timestamp__lte=at,
    ).order_by("-timestamp")
    qs = SpotPool.objects.filter(product=product)
    if instance_types:
        qs = qs.filter(instance_type__name__in=instance_types)
    if per_accelerator:
        qs = qs.filter(instance_type__accelerator_count__gt=0)
    # A pool whose newest change is at or before `at` is priced from the pool row itself (always
    # the case for "now"); only pools that changed after `at` need the probe into the history.
    current = Q(latest_timestamp__lte=at)
    qs = qs.annotate(
        price=Case(When(current, then=F("latest_price")), default=Subquery(in_force.values("price")[:1])),
        since=Case(When(current, then=F("latest_timestamp")), default=Subquery(in_force.values("timestamp")[:1])),
    ).filter(price__isnull=False)
    order = "price"
    if per_accelerator:
        qs = qs.annotate(per_unit=Cast("price", FloatField()) / F("instance_type__accelerator_count"))
        order = "per_unit"
    rows = qs.order_by(order, "instance_type__name", "zone__code").values(
        "price", "since", "instance_type_id", "instance_type__name", "instance_type__on_demand_price",
        "instance_type__accelerator_name", "instance_type__accelerator_count", "zone_id", "zone__code",
        "zone__zone_id", "zone__region__code",
    )[:limit]
    return [
        Pool(
            instance_type=r["instance_type__name"], instance_type_id=r["instance_type_id"], zone=r["zone__code"],
            zone_id=r["zone_id"], zone_aws_id=r["zone__zone_id"], region=r["zone__region__code"],
            price=r["price"], since=r["since"], on_demand_price=r["instance_type__on_demand_price"],
            accelerator_name=r["instance_type__accelerator_name"],
            accelerator_count=r["instance_type__accelerator_count"],
        )
        for r in rows
    ]


def latest_price_timestamp(*, region: str, product: str = LINUX, cloud: str = "aws") -> datetime | None:
    """The newest stored price change of a region (where the next pull starts)."""
    return (
        SpotPool.objects.filter(zone__region__code=region, zone__region__cloud__code=cloud, product=product)
        .aggregate(latest=Max("latest_timestamp"))["latest"]
    )
