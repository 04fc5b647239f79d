"""Catalogue rows (cloud, instance type, region, zone) for what a provider answers, and pools as
JSON for an acquisition's record."""

from __future__ import annotations

from typing import Any

from controlplane.market.models import Cloud, InstanceType, Region, Zone
from controlplane.market.zones import pool_region
from controlplane.orchestration.providers import Pool


def _instance_type_row(provider: str, name: str) -> InstanceType:
    cloud, _ = Cloud.objects.get_or_create(code=provider, defaults={"name": provider})
    itype, _ = InstanceType.objects.get_or_create(cloud=cloud, name=name)
    return itype


def _zone_row(provider: str, code: str) -> Zone | None:
    if not code:
        return None
    zone = Zone.objects.filter(code=code, region__cloud__code=provider).first()
    if zone is not None:
        return zone
    cloud, _ = Cloud.objects.get_or_create(code=provider, defaults={"name": provider})
    region, _ = Region.objects.get_or_create(cloud=cloud, code=pool_region(provider, code))
    zone, _ = Zone.objects.get_or_create(region=region, code=code)
    return zone


def _pool_json(pool: Pool) -> dict[str, Any]:
    return {
        "instance_type": pool.instance_type,
        "zone": pool.zone,
        "price": str(pool.price) if pool.price is not None else None,
        "region": pool.region,
    }
