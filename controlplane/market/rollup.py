"""The hourly roll-up of spot prices (`PriceHour`), kept by folding in every SpotPrice row whose id
is above a watermark. Ids only grow, so rows are folded whatever their timestamp (a back-filled
month of history lands in the right hours), and each row is folded once.

`price_rollup_refresh` runs on the request path before a long-range price chart (a no-op costing
one indexed MAX(id) when nothing is new) and may also run periodically (`market.tasks.refresh_price_rollup`).
`price_rollup_rebuild` starts over, e.g. after price rows were deleted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import TruncHour

from controlplane.market.models import PriceHour, PriceRollupState, SpotPrice

BATCH = 5000


def _state() -> PriceRollupState:
    state, _ = PriceRollupState.objects.get_or_create(pk=1)
    return state


def price_rollup_pending() -> bool:
    """Whether price rows exist that the roll-up has not folded in yet."""
    top = SpotPrice.objects.aggregate(m=Max("id"))["m"] or 0
    return top > _state().last_price_id


@transaction.atomic
def price_rollup_refresh() -> int:
    """Fold every SpotPrice row above the watermark into PriceHour; returns how many rows were
    folded. The state row is locked, so concurrent refreshes fold each row once."""
    top = SpotPrice.objects.aggregate(m=Max("id"))["m"] or 0
    if top <= _state().last_price_id:
        return 0  # the common case on the request path: no lock taken, nothing written
    state = PriceRollupState.objects.select_for_update().get(pk=1)
    if top <= state.last_price_id:
        return 0
    grouped = (
        SpotPrice.objects.filter(id__gt=state.last_price_id, id__lte=top)
        .annotate(h=TruncHour("timestamp", tzinfo=UTC))
        .values("instance_type_id", "zone_id", "product", "h")
        .annotate(n=Count("id"), s=Sum("price"), lo=Min("price"), hi=Max("price"))
        .order_by()
    )
    fresh: dict[tuple[int, int, str, datetime], PriceHour] = {}
    folded = 0
    for row in grouped:
        key = (row["instance_type_id"], row["zone_id"], row["product"], row["h"])
        fresh[key] = PriceHour(instance_type_id=key[0], zone_id=key[1], product=key[2], hour=key[3],
                               hour_index=hour_index(key[3]), changes=row["n"], total=Decimal(row["s"]),
                               low=row["lo"], high=row["hi"])
        folded += row["n"]
    if fresh:
        _merge_existing(fresh)
        PriceHour.objects.bulk_create(
            list(fresh.values()), batch_size=BATCH, update_conflicts=True,
            unique_fields=["instance_type", "zone", "product", "hour_index"],
            update_fields=["changes", "total", "low", "high"],
        )
    state.last_price_id = top
    state.save(update_fields=["last_price_id", "updated_at"])
    return folded


def _merge_existing(fresh: dict[tuple[int, int, str, datetime], PriceHour]) -> None:
    """Add the hours already rolled up to the new counts (same pool and hour)."""
    hours = [key[3] for key in fresh]
    existing = PriceHour.objects.filter(
        instance_type_id__in={key[0] for key in fresh}, zone_id__in={key[1] for key in fresh},
        hour__gte=min(hours), hour__lte=max(hours),
    ).iterator(chunk_size=BATCH)
    for old in existing:
        new = fresh.get((old.instance_type_id, old.zone_id, old.product, old.hour))
        if new is None:
            continue
        new.changes += old.changes
        new.total += old.total
        new.low = min(new.low, old.low)
        new.high = max(new.high, old.high)


@transaction.atomic
def price_rollup_rebuild() -> int:
    """Drop the roll-up and fold the whole price table again."""
    _state()
    PriceRollupState.objects.select_for_update().filter(pk=1).update(last_price_id=0)
    PriceHour.objects.all().delete()
    return price_rollup_refresh()


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def hour_index(value: datetime) -> int:
    """Whole hours from the Unix epoch to `value` (floored)."""
    return int((value - EPOCH).total_seconds() // 3600)


def hourly_buckets(
    *, pools: list[tuple[int, int]], product: str, start: datetime, end: datetime, bucket_seconds: int
) -> dict[tuple[int, int], list[tuple[datetime, Decimal, Decimal, Decimal, int]]]:
    """Per pool (instance type id, zone id): (bucket start, mean, min, max, changes) for each
    non-empty bucket of `bucket_seconds` (a multiple of an hour, aligned on the Unix epoch), from
    the roll-up hours overlapping [start, end). The database groups the hours into buckets in one
    query for all pools. The first bucket may include changes up to an hour before `start`."""
    if bucket_seconds % 3600:
        raise ValueError(f"bucket_seconds must be a multiple of 3600, got {bucket_seconds}")
    wanted = Q()
    for type_id, zone_id in pools:
        wanted |= Q(instance_type_id=type_id, zone_id=zone_id)
    hours_per_bucket = bucket_seconds // 3600
    rows = (
        PriceHour.objects.filter(wanted, product=product, hour_index__gte=hour_index(start),
                                 hour_index__lt=hour_index(end) + 1)
        .annotate(bucket=F("hour_index") / hours_per_bucket)  # integer division on both databases
        .values("instance_type_id", "zone_id", "bucket")
        .annotate(n=Sum("changes"), s=Sum("total"), lo=Min("low"), hi=Max("high"))
        .order_by("instance_type_id", "zone_id", "bucket")
        .values_list("instance_type_id", "zone_id", "bucket", "n", "s", "lo", "hi")
    )
    quantum = Decimal("0.000001")
    out: dict[tuple[int, int], list] = {pool: [] for pool in pools}
    for type_id, zone_id, bucket, n, total, low, high in rows:
        out[(type_id, zone_id)].append((EPOCH + timedelta(seconds=int(bucket) * bucket_seconds),
                                        (Decimal(total) / n).quantize(quantum), Decimal(low), Decimal(high), n))
    return out
