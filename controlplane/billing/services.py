"""Writes on the cost ledger: billing segments per instance.

A segment is a stretch [start, end) of an instance's billable life at one price per hour. Segments
of one instance never overlap and leave no gap: opening after a close starts where the last one
ended at the earliest, a reprice closes at t and reopens at t, and a backfill rebuilds the whole
life at once. Prices come from `market.selectors.spot_price_at` (spot lifecycle) or the instance
type's on-demand price (on-demand lifecycle); when no price is known the segment is priced 0 and
marked `fallback`, so the gap in knowledge is visible rather than silently costed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from controlplane.billing.models import BillingSegment, PriceSource
from controlplane.common.errors import Conflict, DomainError
from controlplane.fleet.models import Instance, Lifecycle
from controlplane.market.models import InstanceType, Zone
from controlplane.market.selectors import spot_price_at, spot_price_changes

ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class Price:
    """A price per hour and where it came from."""

    per_hour: Decimal
    source: str


def _on_demand(instance: Instance) -> Decimal:
    return instance.instance_type.on_demand_price or ZERO


def billing_price_for(*, instance: Instance, at: datetime) -> Price:
    """The price an instance pays per hour at `at`."""
    if instance.lifecycle == Lifecycle.ON_DEMAND:
        on_demand = instance.instance_type.on_demand_price
        if on_demand is None:
            return Price(ZERO, PriceSource.FALLBACK)
        return Price(on_demand, PriceSource.ON_DEMAND)
    if instance.zone_id is None:
        return Price(ZERO, PriceSource.FALLBACK)
    spot = spot_price_at(instance_type=instance.instance_type_id, zone=instance.zone_id, at=at)
    if spot is None:
        return Price(ZERO, PriceSource.FALLBACK)
    return Price(spot, PriceSource.SPOT)


def _new_segment(instance: Instance, start: datetime, end: datetime | None, price: Price) -> BillingSegment:
    return BillingSegment(
        instance=instance, team_id=instance.team_id, job_id=instance.job_id, start=start, end=end,
        price_per_hour=price.per_hour, on_demand_price_per_hour=_on_demand(instance), price_source=price.source,
    )


def _lock(instance: Instance) -> Instance:
    """Lock the instance row so that concurrent ledger writes on it serialise (its callers, the
    orchestration's instance moves, took it and its job already, in `fleet.locks`' order)."""
    return Instance.objects.select_for_update().select_related("instance_type").get(pk=instance.pk)


@transaction.atomic
def billing_open(*, instance: Instance, at: datetime | None = None) -> BillingSegment:
    """Open the instance's billing segment at `at`, priced by what is in force then. Idempotent:
    an instance that already has an open segment keeps it (and gets it back)."""
    at = at or timezone.now()
    locked = _lock(instance)
    existing = BillingSegment.objects.filter(instance=locked, end__isnull=True).first()
    if existing is not None:
        return existing
    last_end = (
        BillingSegment.objects.filter(instance=locked).order_by("-end").values_list("end", flat=True).first()
    )
    if last_end is not None and at < last_end:
        raise Conflict(
            f"cannot open a segment at {at.isoformat()}: instance {locked.pk} is billed until {last_end.isoformat()}",
            field="at",
        )
    segment = _new_segment(locked, at, None, billing_price_for(instance=locked, at=at))
    segment.save()
    return segment


@transaction.atomic
def billing_close(*, instance: Instance, at: datetime | None = None) -> BillingSegment | None:
    """Close the instance's open segment at `at` (never before its start). None when nothing is
    open, so closing twice is harmless."""
    at = at or timezone.now()
    locked = _lock(instance)
    segment = BillingSegment.objects.select_for_update().filter(instance=locked, end__isnull=True).first()
    if segment is None:
        return None
    segment.end = max(at, segment.start)
    segment.save(update_fields=["end"])
    return segment


def billing_close_many(*, instances: Sequence[Instance]) -> int:
    """`billing_close` of many ended instances, each at its own `ended_at`, for a caller that locked
    their rows in its transaction: one read of their open segments (locked) and one update.
    Returns how many segments it closed."""
    ended = {i.pk: i.ended_at for i in instances if i.ended_at is not None}
    segments = list(BillingSegment.objects.select_for_update().filter(instance_id__in=list(ended), end__isnull=True))
    for segment in segments:
        segment.end = max(ended[segment.instance_id], segment.start)
    BillingSegment.objects.bulk_update(segments, ["end"])
    return len(segments)


@transaction.atomic
def billing_reprice(*, instance_type: InstanceType | int, zone: Zone | int, at: datetime) -> int:
    """Apply a spot price change at `at` to the open segments of spot instances in that pool: each
    is closed at `at` and a new one opened at `at` with the new price. A segment that starts at
    `at` is repriced in place (no zero-length segment). Returns how many segments changed."""
    type_id = instance_type.pk if isinstance(instance_type, InstanceType) else instance_type
    zone_id = zone.pk if isinstance(zone, Zone) else zone
    price = spot_price_at(instance_type=type_id, zone=zone_id, at=at)
    if price is None:
        return 0
    open_segments = (
        BillingSegment.objects.select_for_update()
        .filter(end__isnull=True, instance__instance_type_id=type_id, instance__zone_id=zone_id,
                instance__lifecycle=Lifecycle.SPOT, start__lte=at)
        .select_related("instance__instance_type")
    )
    changed = 0
    for segment in open_segments:
        if segment.price_per_hour == price and segment.price_source == PriceSource.SPOT:
            continue
        if segment.start == at:
            segment.price_per_hour, segment.price_source = price, PriceSource.SPOT
            segment.save(update_fields=["price_per_hour", "price_source"])
        else:
            segment.end = at
            segment.save(update_fields=["end"])
            _new_segment(segment.instance, at, None, Price(price, PriceSource.SPOT)).save()
        changed += 1
    return changed


def _life_pieces(instance: Instance, start: datetime, end: datetime | None) -> list[tuple[datetime, Price]]:
    """(start, price) for every price change of the instance's life, merging equal prices."""
    pieces = [(start, billing_price_for(instance=instance, at=start))]
    if instance.lifecycle == Lifecycle.SPOT and instance.zone_id is not None:
        for ts, price in spot_price_changes(
            instance_type=instance.instance_type_id, zone=instance.zone_id, start=start, end=end
        ):
            pieces.append((ts, Price(price, PriceSource.SPOT)))
    merged: list[tuple[datetime, Price]] = []
    for piece in pieces:
        if merged and merged[-1][1] == piece[1]:
            continue  # a "change" to the same price is not a new segment
        merged.append(piece)
    return merged


@transaction.atomic
def billing_backfill(*, instance: Instance) -> list[BillingSegment]:
    """Rebuild the instance's segments for its whole life [running_at, ended_at) from the stored
    price history, splitting at every price change. Replaces any segments it had. An instance
    still alive keeps its last segment open."""
    locked = _lock(instance)
    if locked.running_at is None:
        raise DomainError(f"instance {locked.pk} never ran; nothing to bill", field="instance")
    end = locked.ended_at
    if end is not None and end < locked.running_at:
        raise DomainError(f"instance {locked.pk} ended before it ran", field="instance")
    BillingSegment.objects.filter(instance=locked).delete()
    pieces = _life_pieces(locked, locked.running_at, end)
    segments = []
    for i, (start, price) in enumerate(pieces):
        seg_end = pieces[i + 1][0] if i + 1 < len(pieces) else end
        segments.append(_new_segment(locked, start, seg_end, price))
    return BillingSegment.objects.bulk_create(segments)


@transaction.atomic
def billing_reprice_open_segments(*, until: datetime | None = None) -> int:
    """Bring every open spot segment up to date with the stored price history up to `until`
    (default now): split at each later change, and price a `fallback` segment whose price has
    since become known. Run after each price pull; idempotent. Returns how many segments changed."""
    until = until or timezone.now()
    changed = 0
    open_segments = (
        BillingSegment.objects.select_for_update()
        .filter(end__isnull=True, instance__lifecycle=Lifecycle.SPOT, instance__zone__isnull=False, start__lte=until)
        .select_related("instance__instance_type")
    )
    for segment in open_segments:
        instance = segment.instance
        if segment.price_source == PriceSource.FALLBACK:
            known = spot_price_at(instance_type=instance.instance_type_id, zone=instance.zone_id, at=segment.start)
            if known is not None:
                segment.price_per_hour, segment.price_source = known, PriceSource.SPOT
                segment.save(update_fields=["price_per_hour", "price_source"])
                changed += 1
        changes = spot_price_changes(
            instance_type=instance.instance_type_id, zone=instance.zone_id, start=segment.start, end=None
        )
        for ts, price in changes:
            if ts > until:
                break
            if price == segment.price_per_hour and segment.price_source == PriceSource.SPOT:
                continue
            segment.end = ts
            segment.save(update_fields=["end"])
            segment = _new_segment(instance, ts, None, Price(price, PriceSource.SPOT))
            segment.save()
            changed += 1
    return changed
