"""Writes on the market catalogue: clouds, regions, zones and instance types.

Spot prices are written by `market.ingest` (files) and `market.pull` (the AWS API), both through
`market.ingest.spot_prices_load`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from django.db import transaction

from controlplane.market.models import Cloud, InstanceType, Region, Zone
from controlplane.market.zones import is_zone_id, region_for_zone

CATALOGUE_PATH = Path(__file__).resolve().parent / "fixtures" / "catalogue.json"
AWS = "aws"
_CLOUD_NAMES = {"aws": "Amazon Web Services", "local": "Local processes on this host"}


@dataclass(frozen=True, slots=True)
class CatalogueCounts:
    """What `catalogue_load` did."""

    created: int
    updated: int
    unchanged: int


def cloud_ensure(*, code: str, using: str = "default") -> Cloud:
    """The Cloud with `code`, created if missing."""
    cloud, _ = Cloud.objects.using(using).get_or_create(code=code, defaults={"name": _CLOUD_NAMES.get(code, code)})
    return cloud


def region_ensure(*, cloud: Cloud, code: str, using: str = "default") -> Region:
    region, _ = Region.objects.using(using).get_or_create(cloud=cloud, code=code)
    return region


@transaction.atomic
def catalogue_load(*, path: Path = CATALOGUE_PATH) -> CatalogueCounts:
    """Load the bundled instance-type catalogue (and the `local` cloud). Idempotent: a second run
    changes nothing; a changed fixture updates the rows it describes and leaves others alone.

    Types first met in price files keep their row; the catalogue fills in their specs."""
    data = json.loads(Path(path).read_text())
    clouds = {c["code"]: cloud_ensure(code=c["code"]) for c in data["clouds"]}
    for region_data in data.get("regions", []):
        region = region_ensure(cloud=clouds[region_data["cloud"]], code=region_data["code"])
        for zone_data in region_data.get("zones", []):
            Zone.objects.get_or_create(
                region=region, code=zone_data["code"], defaults={"zone_id": zone_data.get("zone_id")}
            )
    created = updated = unchanged = 0
    fields = ("vcpus", "memory_gib", "accelerator_name", "accelerator_count", "accelerator_memory_gib",
              "network_gbps", "on_demand_price")
    for item in data["instance_types"]:
        values = {
            "vcpus": int(item["vcpus"]),
            "memory_gib": Decimal(item["memory_gib"]),
            "accelerator_name": item.get("accelerator_name", ""),
            "accelerator_count": int(item.get("accelerator_count", 0)),
            "accelerator_memory_gib": Decimal(item.get("accelerator_memory_gib", "0")),
            "network_gbps": Decimal(item.get("network_gbps", "0")),
            "on_demand_price": None if item.get("on_demand_price") is None else Decimal(item["on_demand_price"]),
        }
        itype, was_created = InstanceType.objects.get_or_create(
            cloud=clouds[item["cloud"]], name=item["name"], defaults=values
        )
        if was_created:
            created += 1
            continue
        changed = [f for f in fields if getattr(itype, f) != values[f]]
        if changed:
            for f in changed:
                setattr(itype, f, values[f])
            itype.save(update_fields=[*changed, "updated_at"])
            updated += 1
        else:
            unchanged += 1
    return CatalogueCounts(created=created, updated=updated, unchanged=unchanged)


def instance_types_ensure(*, names: Iterable[str], cloud_code: str = AWS, using: str = "default") -> dict[str, int]:
    """Map instance-type names to ids, creating the unknown ones with no specs and an unknown
    (null) on-demand price. Safe under concurrency: inserts ignore conflicts, then re-read."""
    wanted = set(names)
    if not wanted:
        return {}
    cloud = cloud_ensure(code=cloud_code, using=using)
    manager = InstanceType.objects.using(using)
    found = dict(manager.filter(cloud=cloud, name__in=wanted).values_list("name", "id"))
    missing = wanted - found.keys()
    if missing:
        manager.bulk_create(
            [InstanceType(cloud=cloud, name=name, on_demand_price=None) for name in sorted(missing)],
            ignore_conflicts=True,
        )
        found.update(manager.filter(cloud=cloud, name__in=missing).values_list("name", "id"))
    return found


def zones_ensure(*, values: Iterable[str], cloud_code: str = AWS, using: str = "default") -> dict[str, int]:
    """Map zone IDs (`use1-az4`) or zone names (`us-east-1a`) to Zone ids, creating unknown zones
    (and their regions) on the way. A zone ID is matched on `Zone.zone_id`, a name on `Zone.code`."""
    wanted = set(values)
    if not wanted:
        return {}
    cloud = cloud_ensure(code=cloud_code, using=using)
    manager = Zone.objects.using(using)
    ids = {v for v in wanted if is_zone_id(v)}
    names = wanted - ids
    found: dict[str, int] = {}
    found.update(manager.filter(zone_id__in=ids).values_list("zone_id", "id"))
    found.update(manager.filter(region__cloud=cloud, code__in=names).values_list("code", "id"))
    missing = wanted - found.keys()
    if missing:
        regions: dict[str, Region] = {}
        new = []
        for value in sorted(missing):
            region_code = region_for_zone(value)
            if region_code not in regions:
                regions[region_code] = region_ensure(cloud=cloud, code=region_code, using=using)
            new.append(Zone(region=regions[region_code], code=value, zone_id=value if value in ids else None))
        manager.bulk_create(new, ignore_conflicts=True)
        found.update(manager.filter(zone_id__in=missing & ids).values_list("zone_id", "id"))
        found.update(manager.filter(region__cloud=cloud, code__in=missing - ids).values_list("code", "id"))
    return found


@transaction.atomic
def zone_name_register(*, zone_id: str, name: str, region_code: str, cloud_code: str = AWS) -> Zone:
    """Record that, for our AWS account, zone `name` (`us-east-1a`) is zone `zone_id` (`use1-az4`)
    (from `describe_availability_zones`). A zone first seen by ID gets its name as `code`."""
    cloud = cloud_ensure(code=cloud_code)
    region = region_ensure(cloud=cloud, code=region_code)
    zone = Zone.objects.select_for_update().filter(zone_id=zone_id).first()
    if zone is None:
        zone = Zone.objects.select_for_update().filter(region=region, code=name).first()
        if zone is None:
            return Zone.objects.create(region=region, code=name, zone_id=zone_id)
        if zone.zone_id is None:
            zone.zone_id = zone_id
            zone.save(update_fields=["zone_id"])
        return zone
    if zone.code == zone_id and not Zone.objects.filter(region=zone.region, code=name).exists():
        zone.code = name
        zone.save(update_fields=["code"])
    return zone


# The newest change of each pool; the same statement fills the table in migration 0002.
_REBUILD_POOLS_SQL = """
INSERT INTO market_spotpool (instance_type_id, zone_id, product, latest_timestamp, latest_price)
SELECT s.instance_type_id, s.zone_id, s.product, s."timestamp", s.price
FROM market_spotprice s
WHERE s."timestamp" = (
    SELECT MAX(t."timestamp") FROM market_spotprice t
    WHERE t.instance_type_id = s.instance_type_id AND t.zone_id = s.zone_id AND t.product = s.product
)
"""


def spot_pools_rebuild(*, using: str = "default") -> int:
    """Rebuild the SpotPool table from the price history (for prices written without the loader,
    e.g. by raw SQL or `SpotPrice.objects.create`). Returns the number of pools."""
    from django.db import connections

    from controlplane.market.models import SpotPool

    with transaction.atomic(using=using):
        SpotPool.objects.using(using).all().delete()
        with connections[using].cursor() as cursor:
            cursor.execute(_REBUILD_POOLS_SQL)
        return SpotPool.objects.using(using).count()
