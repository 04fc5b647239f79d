"""AWS zone naming: zone IDs (`use1-az4`, global) and zone names (`us-east-1a`, per account), and
the region of a pool (`pool_region`).

Price history identifies zones by ID; the ID's prefix names the region. The map covers every
commercial and GovCloud region (and every prefix in the reference price file)."""

from __future__ import annotations

import re

from controlplane.market.local_pool import LOCAL_REGION
from controlplane.tunables import tunable

# Zone-ID prefix -> region code.
ZONE_ID_PREFIX_TO_REGION: dict[str, str] = {
    "use1": "us-east-1",
    "use2": "us-east-2",
    "usw1": "us-west-1",
    "usw2": "us-west-2",
    "usge1": "us-gov-east-1",
    "usgw1": "us-gov-west-1",
    "cac1": "ca-central-1",
    "caw1": "ca-west-1",
    "mxc1": "mx-central-1",
    "sae1": "sa-east-1",
    "euc1": "eu-central-1",
    "euc2": "eu-central-2",
    "euw1": "eu-west-1",
    "euw2": "eu-west-2",
    "euw3": "eu-west-3",
    "eun1": "eu-north-1",
    "eus1": "eu-south-1",
    "eus2": "eu-south-2",
    "ilc1": "il-central-1",
    "mec1": "me-central-1",
    "mes1": "me-south-1",
    "afs1": "af-south-1",
    "ape1": "ap-east-1",
    "ape2": "ap-east-2",
    "apne1": "ap-northeast-1",
    "apne2": "ap-northeast-2",
    "apne3": "ap-northeast-3",
    "aps1": "ap-south-1",
    "aps2": "ap-south-2",
    "apse1": "ap-southeast-1",
    "apse2": "ap-southeast-2",
    "apse3": "ap-southeast-3",
    "apse4": "ap-southeast-4",
    "apse5": "ap-southeast-5",
    "apse7": "ap-southeast-7",
}

_ZONE_ID = re.compile(r"^(?P<prefix>[a-z]+[0-9]+)-az[0-9]+$")
# us-east-1a, us-gov-west-1b, ap-northeast-1-wl1-nrt-wlz1 (wavelength) are not matched by the last.
_ZONE_NAME = re.compile(r"^(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-[0-9]+)[a-z]$")


def is_zone_id(value: str) -> bool:
    """True for a zone ID such as `use1-az4`."""
    return bool(_ZONE_ID.match(value))


def region_for_zone(value: str) -> str:
    """The region code of a zone ID (`use1-az4` -> `us-east-1`) or zone name (`us-east-1a`).

    An ID whose prefix is not in the map keeps the prefix as its region code, so an unknown new
    region still loads (and shows up under a recognisable name) instead of failing the import."""
    match = _ZONE_ID.match(value)
    if match:
        prefix = match["prefix"]
        return ZONE_ID_PREFIX_TO_REGION.get(prefix, prefix)
    match = _ZONE_NAME.match(value)
    if match:
        return match["region"]
    # Local or otherwise unrecognised zone: its own region.
    return value


def region_prefix(region_code: str) -> str | None:
    """The zone-ID prefix of a region (`us-east-1` -> `use1`), or None when unknown."""
    for prefix, code in ZONE_ID_PREFIX_TO_REGION.items():
        if code == region_code:
            return prefix
    return None


def region_of_zone(zone: str) -> str:
    """The region of a zone name (`us-east-1a` -> `us-east-1`) or of a zone ID whose prefix is in
    the map (`use1-az4` -> `us-east-1`); "" when it cannot be told without asking AWS (an unknown
    ID prefix, a local or wavelength zone, ""). Unlike `region_for_zone`, never guesses: the aws
    provider uses it to route a launch, where a wrong region is worse than none."""
    match = _ZONE_ID.match(zone)
    if match:
        return ZONE_ID_PREFIX_TO_REGION.get(match["prefix"], "")
    match = _ZONE_NAME.match(zone)
    return match["region"] if match else ""


def pool_region(provider: str, zone: str, region: str = "") -> str:
    """The region of a pool or a zone, the unit a job's nodes stay within: its own, else its zone's,
    else the provider's default (every local zone is in the one local region)."""
    if provider == "local":
        return LOCAL_REGION
    if region:
        return region
    if zone:
        return region_for_zone(zone)
    return str(tunable("SPOTPIPE_AWS_REGION"))
