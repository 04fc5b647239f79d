"""Instance types the planner can price, and their interruption risk from spot-advisor buckets.

The package ships a small table (`data/instance_types.json`, a few dozen training-relevant AWS
types with datasheet peak throughput, memory bandwidth, network and the spot-advisor bucket) so the
planner works with no database and no reference data. `load_spot_advisor(path)` reads a full
Spot Instance Advisor snapshot (the `spot-advisor-data-*.json[.gz]` format) that a user points to.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).with_name("data")
HOURS_PER_MONTH = 730.0

BUCKET_MONTHLY_FRACTION = (0.025, 0.075, 0.125, 0.175, 0.30)
"""Representative fraction of instances interrupted per month per advisor bucket (<5%, 5-10%,
10-15%, 15-20%, >20%): the bucket midpoints, 30% for the open-ended top bucket."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What the throughput model needs to know about a VM shape."""

    name: str
    accelerator: str
    accelerators: int
    device_memory_gib: float
    peak_tflops: float
    memory_bandwidth_gbs: float
    network_gbps: float
    on_demand_usd_per_hour: float
    advisor_bucket: int | None = None
    """Spot-advisor interruption bucket index (0..4) in the default region, None when unknown."""
    advisor_savings_percent: int | None = None
    """Spot-advisor savings over on-demand in that region (a spot price when no price is recorded)."""

    @property
    def typical_spot_usd_per_hour(self) -> float:
        """On-demand less the advisor's savings (30% of on-demand when unknown)."""
        savings = self.advisor_savings_percent if self.advisor_savings_percent is not None else 70
        return self.on_demand_usd_per_hour * (1 - savings / 100)

    @property
    def advisor_rate_per_node_hour(self) -> float | None:
        return None if self.advisor_bucket is None else bucket_rate_per_hour(self.advisor_bucket)

    @property
    def device_memory_bytes(self) -> float:
        return self.device_memory_gib * 2**30


@cache
def _shipped() -> dict:
    return json.loads((DATA / "instance_types.json").read_text())


def instance_types(region: str = "us-east-1") -> dict[str, InstanceSpec]:
    """The shipped instance types, with the advisor bucket of `region` where known."""
    out = {}
    for name, t in _shipped()["types"].items():
        advice = t["spot_advisor"].get(region, {})
        out[name] = InstanceSpec(
            name=name,
            accelerator=t["accelerator"],
            accelerators=t["accelerators"],
            device_memory_gib=t["device_memory_gib"],
            peak_tflops=t["peak_tflops"],
            memory_bandwidth_gbs=t["memory_bandwidth_gbs"],
            network_gbps=t["network_gbps"],
            on_demand_usd_per_hour=t["on_demand_usd_per_hour"],
            advisor_bucket=advice.get("bucket"),
            advisor_savings_percent=advice.get("savings_percent"),
        )
    return out


def bucket_rate_per_hour(bucket: int) -> float:
    """Preemption rate per node-hour implied by a spot-advisor bucket (a constant hazard)."""
    if not 0 <= bucket < len(BUCKET_MONTHLY_FRACTION):
        raise ValueError(f"advisor bucket {bucket} is unknown; expected 0..{len(BUCKET_MONTHLY_FRACTION) - 1}")
    return -math.log(1.0 - BUCKET_MONTHLY_FRACTION[bucket]) / HOURS_PER_MONTH


def load_spot_advisor(path: Path | str, *, region: str = "us-east-1", os_name: str = "Linux") -> dict[str, int]:
    """Instance type -> advisor bucket for `region` from a full snapshot file (.json or .json.gz)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data = json.loads(raw)
    try:
        table = data["spot_advisor"][region][os_name]
    except KeyError as exc:
        raise ValueError(f"{path.name} has no spot_advisor[{region!r}][{os_name!r}] table") from exc
    return {name: int(entry["r"]) for name, entry in table.items()}
