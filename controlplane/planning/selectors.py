"""Reads the planner needs from the control plane: current spot prices per pool and preemption
rates per pool from the notices we recorded, with the spot-advisor bucket as the fallback.

The planner core (`runtime.planner`) takes plain `Pool` values; this module builds them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import Q

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.market.models import InstanceType, SpotPool, Zone
from controlplane.market.selectors import spot_price_at
from runtime.planner.catalog import instance_types as shipped_types
from runtime.planner.search import Pool

MIN_EXPOSURE_HOURS = 50.0
"""Below this many recorded instance-hours in a pool, our own notices say too little; the
spot-advisor bucket is used instead."""
LOOKBACK = timedelta(days=30)


def pool_preemption_rate(
    *, instance_type: str, zone: str | None, at: datetime, team_ids: Iterable[int] | None
) -> tuple[float, float] | None:
    """(preemptions per node-hour, exposure hours) from our recorded instances of this pool over the
    last 30 days, or None when nothing ran there. `team_ids` None means every team (operators)."""
    since = at - LOOKBACK
    qs = Instance.objects.filter(instance_type__name=instance_type, running_at__isnull=False, running_at__lt=at)
    qs = qs.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
    if zone:
        qs = qs.filter(Q(zone__code=zone) | Q(zone__zone_id=zone))
    if team_ids is not None:
        qs = qs.filter(team_id__in=list(team_ids))
    hours = 0.0
    preempted = 0
    for running_at, ended_at, state, notice_at in qs.values_list("running_at", "ended_at", "state", "notice_at"):
        start = max(running_at, since)
        end = min(ended_at or at, at)
        hours += max(0.0, (end - start).total_seconds() / 3600.0)
        if state in (InstanceState.PREEMPTED, InstanceState.NOTICE) or notice_at is not None:
            preempted += 1
    if hours <= 0:
        return None
    return preempted / hours, hours


def pools_for_plan(
    *,
    instance_types: list[str],
    zones: list[str] | None,
    at: datetime,
    team_ids: Iterable[int] | None,
    max_nodes: int,
    region: str = "us-east-1",
) -> list[Pool]:
    """One `Pool` per (allowed type, zone with a recorded price), or per type when no price is stored
    (then the advisor's typical savings give the price). Rates: our notices when we have enough
    exposure in the pool, else the spot-advisor bucket, else 0 with risk_source `unknown`."""
    catalog = shipped_types(region)
    team_ids = list(team_ids) if team_ids is not None else None
    out: list[Pool] = []
    for name in instance_types:
        itype = InstanceType.objects.filter(name=name).first()
        shipped = catalog.get(name)
        on_demand = float(itype.on_demand_price) if itype and itype.on_demand_price is not None else None
        if on_demand is None and shipped:
            on_demand = shipped.on_demand_usd_per_hour
        pool_zones: list[Zone | None] = []
        if itype is not None:
            known = SpotPool.objects.filter(instance_type=itype).select_related("zone").order_by("zone__code")
            if zones:
                known = known.filter(Q(zone__code__in=zones) | Q(zone__zone_id__in=zones))
            pool_zones = [p.zone for p in known]
        if not pool_zones:
            pool_zones = [None]
        for zone in pool_zones:
            price = spot_price_at(instance_type=itype, zone=zone, at=at) if itype and zone else None
            if price is not None:
                spot = float(price)
            elif shipped:
                spot = shipped.typical_spot_usd_per_hour
            else:
                spot = on_demand or 0.0
            rate_source = "unknown"
            rate = 0.0
            measured = pool_preemption_rate(
                instance_type=name, zone=zone.code if zone else None, at=at, team_ids=team_ids
            )
            if measured and measured[1] >= MIN_EXPOSURE_HOURS:
                rate, rate_source = measured[0], "notices"
            elif shipped and shipped.advisor_rate_per_node_hour is not None:
                rate, rate_source = shipped.advisor_rate_per_node_hour, "advisor"
            out.append(
                Pool(
                    instance_type=name,
                    zone=zone.code if zone else "",
                    spot_usd_per_hour=spot,
                    on_demand_usd_per_hour=on_demand,
                    preemptions_per_node_hour=rate,
                    risk_source=rate_source,
                    max_nodes=max_nodes,
                )
            )
    return out
