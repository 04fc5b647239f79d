"""Live spot prices from the AWS API (`describe_spot_price_history`, paged), stored through the
same idempotent loader as price files.

Each pull of a region starts at the newest change already stored for that region, so a pull
re-reads at most the last change (which the loader recognises) and adds only what is new."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from django.utils import timezone

from controlplane.market.ingest import LoadCounts, PriceRow, normalise_product, parse_price, spot_prices_load
from controlplane.market.models import InstanceType
from controlplane.market.selectors import LINUX, latest_price_timestamp
from controlplane.market.services import zone_name_register
from controlplane.tunables import tunable

logger = logging.getLogger(__name__)
# How far back the first pull of a region reaches.
FIRST_PULL_LOOKBACK = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class PullResult:
    """What one region's pull did."""

    region: str
    start: datetime
    pages: int
    counts: LoadCounts


def ec2_client(*, region: str) -> Any:
    """A boto3 EC2 client for `region`, pointed at `SPOTPIPE_AWS_ENDPOINT_URL` when set
    (moto in tests, a VPC endpoint in production)."""
    return boto3.client("ec2", region_name=region, endpoint_url=tunable("SPOTPIPE_AWS_ENDPOINT_URL") or None)


def default_instance_types() -> list[str]:
    """The AWS types of the catalogue that have a known on-demand price (the ones we may buy)."""
    return sorted(
        InstanceType.objects.filter(cloud__code="aws", on_demand_price__isnull=False).values_list("name", flat=True)
    )


def _zone_ids_by_name(client: Any, region: str) -> dict[str, str]:
    """Zone name -> zone ID for this account, recorded in the catalogue on the way. Price history
    names zones per account (`us-east-1a`); stored prices key on the global ID (`use1-az4`)."""
    mapping: dict[str, str] = {}
    for zone in client.describe_availability_zones()["AvailabilityZones"]:
        name, zone_id = zone.get("ZoneName"), zone.get("ZoneId")
        if name and zone_id:
            mapping[name] = zone_id
            zone_name_register(zone_id=zone_id, name=name, region_code=region)
    return mapping


def _history_rows(pages: Iterator[dict[str, Any]], zone_ids: dict[str, str], tally: list[int]) -> Iterator[PriceRow]:
    for page in pages:
        tally[0] += 1
        for item in page.get("SpotPriceHistory", []):
            zone_name = item.get("AvailabilityZone", "")
            zone = item.get("AvailabilityZoneId") or zone_ids.get(zone_name) or zone_name
            try:
                price = parse_price(str(item["SpotPrice"]))
            except ValueError:
                logger.warning("skipping spot price with a bad value: %r", item)
                continue
            ts = item["Timestamp"]  # botocore parses it to a datetime
            yield PriceRow(
                zone=zone, instance_type=item["InstanceType"], product=normalise_product(item["ProductDescription"]),
                price=price, timestamp=ts.astimezone(UTC) if ts.tzinfo else ts.replace(tzinfo=UTC),
            )


def spot_prices_pull_region(
    *, region: str, instance_types: list[str] | None = None, page_size: int = 1000, now: datetime | None = None
) -> PullResult:
    """Pull Linux/UNIX spot price history of one region since its newest stored change and store it."""
    now = now or timezone.now()
    types = instance_types if instance_types is not None else default_instance_types()
    start = latest_price_timestamp(region=region) or (now - FIRST_PULL_LOOKBACK)
    client = ec2_client(region=region)
    zone_ids = _zone_ids_by_name(client, region)
    paginator = client.get_paginator("describe_spot_price_history")
    pages = paginator.paginate(
        InstanceTypes=types,
        ProductDescriptions=[LINUX],
        StartTime=start,
        EndTime=now,
        PaginationConfig={"PageSize": page_size},
    )
    tally = [0]
    # One transaction for the whole pull: pages are not in time order across pools, so storing a
    # partial pull would move the next pull's start past changes that were never stored.
    counts = spot_prices_load(rows=_history_rows(iter(pages), zone_ids, tally))
    logger.info("pulled %s spot prices of %s since %s: %s new, %s known, %s pages",
                counts.rows, region, start.isoformat(), counts.inserted, counts.already_present, tally[0])
    return PullResult(region=region, start=start, pages=tally[0], counts=counts)


def spot_prices_pull(
    *, regions: list[str] | None = None, instance_types: list[str] | None = None
) -> list[PullResult]:
    """Pull every configured region (default: `SPOTPIPE_AWS_REGION`)."""
    regions = regions or [tunable("SPOTPIPE_AWS_REGION")]
    return [spot_prices_pull_region(region=region, instance_types=instance_types) for region in regions]
