"""Where a pool is: its region, the unit a job's nodes stay within."""

from __future__ import annotations

from controlplane.market.zones import region_for_zone
from controlplane.orchestration.providers.local.provider import LOCAL_REGION
from controlplane.tunables import tunable


def pool_region(provider: str, zone: str, region: str = "") -> str:
    """The region of a pool or a zone: its own, else its zone's, else the provider's default (every
    local zone is in the one local region)."""
    if provider == "local":
        return LOCAL_REGION
    if region:
        return region
    if zone:
        return region_for_zone(zone)
    return str(tunable("SPOTPIPE_AWS_REGION"))
