"""Seeding the demo's database: the instance-type catalogue, a spot price history (the bundled
synthetic market or a file the user names), the local pool's prices, and a demo team with an admin
user and an API token. Every step is idempotent: a second demo on the same database adds only what
is new."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.models import ApiToken, Membership, Role, Team, TokenKind
from controlplane.accounts.services import api_token_create, api_token_revoke
from controlplane.market.ingest import PriceRow, spot_prices_ingest_file, spot_prices_load
from controlplane.market.local_pool import LOCAL_INSTANCE_TYPE, LOCAL_ZONE
from controlplane.market.models import InstanceType, SpotPool, SpotPrice, Zone
from controlplane.market.services import catalogue_load
from spotpipe.demo import market

DEMO_TEAM = "demo"
DEMO_USER = "demo"
DEMO_PASSWORD = "spotpipe-demo"
TOKEN_NAME = "spotpipe demo"


@dataclass(frozen=True, slots=True)
class MarketSeed:
    """What the market seeding did: rows read and new, and which pool the local nodes are priced as."""

    source: str
    rows: int
    inserted: int
    pools: int
    stand_in: str
    stand_in_price: Decimal
    on_demand_price: Decimal


@dataclass(frozen=True, slots=True)
class TeamSeed:
    team: Team
    user: Any
    username: str
    password: str
    token: str


def seed_market(*, seed: int, prices: Path | None = None, now: datetime | None = None) -> MarketSeed:
    """Load the catalogue and a price history, then price the local pool like the stand-in pool."""
    now = now or timezone.now()
    catalogue_load()
    if prices is not None:
        report = spot_prices_ingest_file(path=prices, skip_bad=True)
        source, counts = str(prices), report.counts
    else:
        rows = (PriceRow(zone=p.zone, instance_type=p.instance_type, product=market.LINUX, price=p.price,
                         timestamp=p.timestamp) for p in market.synthetic_history(seed=seed, end=now))
        source, counts = f"synthetic market (seed {seed})", spot_prices_load(rows=rows)
    stand_in, price, on_demand = _price_local_pool()
    return MarketSeed(source=source, rows=counts.rows, inserted=counts.inserted, pools=SpotPool.objects.count(),
                      stand_in=stand_in, stand_in_price=price, on_demand_price=on_demand)


def _stand_in_pool() -> SpotPool | None:
    """The cheapest Linux pool of the stand-in type, else the cheapest accelerated pool, else any."""
    pools = SpotPool.objects.filter(product=market.LINUX).exclude(instance_type__cloud__code="local")
    pools = pools.select_related("instance_type", "zone").order_by("latest_price", "id")
    return (pools.filter(instance_type__name=market.STAND_IN_TYPE).first()
            or pools.filter(instance_type__accelerator_count__gt=0).first() or pools.first())


@transaction.atomic
def _price_local_pool() -> tuple[str, Decimal, Decimal]:
    """Copy the stand-in pool's price history into the local pool (`local.node` in zone `local`) and
    give `local.node` the stand-in's on-demand price, so the demo's bills and savings read like the
    cloud's. Returns (stand-in pool, its latest price, on-demand price)."""
    pool = _stand_in_pool()
    local_type = InstanceType.objects.get(cloud__code="local", name=LOCAL_INSTANCE_TYPE)
    local_zone = Zone.objects.get(region__cloud__code="local", code=LOCAL_ZONE)
    if pool is None:
        return "none (local nodes are billed at 0)", Decimal(0), Decimal(0)
    history = SpotPrice.objects.filter(instance_type=pool.instance_type, zone=pool.zone, product=pool.product)
    SpotPrice.objects.bulk_create(
        [SpotPrice(instance_type=local_type, zone=local_zone, product=pool.product, price=p.price,
                   timestamp=p.timestamp) for p in history.order_by("timestamp")],
        ignore_conflicts=True,
    )
    SpotPool.objects.update_or_create(
        instance_type=local_type, zone=local_zone, product=pool.product,
        defaults={"latest_timestamp": pool.latest_timestamp, "latest_price": pool.latest_price},
    )
    on_demand = pool.instance_type.on_demand_price or Decimal(0)
    if local_type.on_demand_price != on_demand:
        local_type.on_demand_price = on_demand
        local_type.save(update_fields=["on_demand_price", "updated_at"])
    zone = pool.zone.zone_id or pool.zone.code
    return f"{pool.instance_type.name} in {zone}", pool.latest_price, on_demand


@transaction.atomic
def seed_team() -> TeamSeed:
    """The demo team, its admin user (password reset to the demo's) and a fresh API token (the
    previous demo tokens are revoked: a key is shown once, so each run prints a new one)."""
    team, _ = Team.objects.get_or_create(slug=DEMO_TEAM, defaults={"name": "Demo team"})
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True})
    user.set_password(DEMO_PASSWORD)
    user.is_staff = True
    user.is_superuser = True
    user.save()
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": Role.ADMIN})
    for old in ApiToken.objects.filter(team=team, user=user, name=TOKEN_NAME, kind=TokenKind.USER,
                                       revoked_at__isnull=True):
        api_token_revoke(token=old)
    _token, key = api_token_create(team=team, kind=TokenKind.USER, name=TOKEN_NAME, user=user)
    return TeamSeed(team=team, user=user, username=user.username, password=DEMO_PASSWORD, token=key)
