"""Unavailable offerings: the one store of pools a launch must not ask now, with its two reasons.

- `no_capacity`: an offering (provider, instance type, zone, capacity type) answered a capacity or
  quota error (`providers.base.CAPACITY_CODES`). Every team's launches skip it for
  `SPOTPIPE_CAPACITY_UNAVAILABLE_S` (default 180 s, Karpenter's 3 minutes), stored in the database
  so every worker sees it (`UnavailableOffering`).
- `preempted`: a pool that preempted one of the team's nodes, or served it a notice, within
  `POOL_COOLDOWN`. Read from the team's own instance rows, which already record it: the cool-down
  is team-scoped, and a launch falls back to cooling pools when nothing else is left.

`unavailable_offerings` lists both for the API and the fleet page; `pool_unavailability` is what
ranking and launching ask.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.orchestration.models import UnavailableOffering
from controlplane.orchestration.providers.base import Pool
from controlplane.tunables import tunable
from runtime.planner.capacity_policy import SPOT

NO_CAPACITY = "no_capacity"
PREEMPTED = "preempted"
POOL_COOLDOWN = timedelta(minutes=3)
"""How long a pool that preempted one of the team's nodes is not asked again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Unavailability:
    """One offering launches skip until `until`, and why."""

    provider: str
    instance_type: str
    zone: str
    capacity_type: str
    reason: str
    """`no_capacity` (every team) or `preempted` (the team's cool-down)."""
    until: datetime
    code: str = ""
    region: str = ""

    @property
    def pool_key(self) -> str:
        return f"{self.instance_type}@{self.zone or '*'}"

    def to_dict(self) -> dict[str, str]:
        return {"provider": self.provider, "instance_type": self.instance_type, "zone": self.zone,
                "region": self.region, "capacity_type": self.capacity_type, "reason": self.reason,
                "code": self.code, "pool": self.pool_key, "until": self.until.isoformat()}


def unavailable_ttl() -> timedelta:
    return timedelta(seconds=float(tunable("SPOTPIPE_CAPACITY_UNAVAILABLE_S")))


def offerings_mark_no_capacity(*, provider: str, pools: Iterable[Pool], capacity_type: str, code: str,
                               now: datetime | None = None) -> list[UnavailableOffering]:
    """Mark the pools' offerings unavailable for every team until now + the TTL (one upsert for all:
    a mark made again moves its expiry)."""
    now = now or timezone.now()
    until = now + unavailable_ttl()
    rows = {
        (p.instance_type, p.zone): UnavailableOffering(
            provider=provider, instance_type=p.instance_type[:64], zone=p.zone[:64], capacity_type=capacity_type,
            region=p.region[:40], code=(code or "InsufficientCapacity")[:100], marked_at=now, until=until)
        for p in pools
    }
    if not rows:
        return []
    return UnavailableOffering.objects.bulk_create(
        list(rows.values()), update_conflicts=True,
        unique_fields=["provider", "instance_type", "zone", "capacity_type"],
        update_fields=["region", "code", "marked_at", "until"])


def _no_capacity(*, provider: str | None, capacity_type: str | None, now: datetime) -> list[Unavailability]:
    rows = UnavailableOffering.objects.filter(until__gt=now)
    if provider:
        rows = rows.filter(provider=provider)
    if capacity_type:
        rows = rows.filter(capacity_type=capacity_type)
    return [Unavailability(provider=r.provider, instance_type=r.instance_type, zone=r.zone,
                           capacity_type=r.capacity_type, reason=NO_CAPACITY, until=r.until, code=r.code,
                           region=r.region) for r in rows]


def _preempted(*, team_id: int, provider: str | None, now: datetime) -> list[Unavailability]:
    since = now - POOL_COOLDOWN
    rows = Instance.objects.filter(
        Q(notice_at__gte=since) | Q(state=InstanceState.PREEMPTED, ended_at__gte=since), team_id=team_id)
    if provider:
        rows = rows.filter(provider=provider)
    latest: dict[tuple[str, str, str], datetime] = {}
    for prov, itype, zone, notice_at, ended_at in rows.values_list(
            "provider", "instance_type__name", "zone__code", "notice_at", "ended_at"):
        seen = max(t for t in (notice_at, ended_at) if t is not None and t >= since)
        key = (prov, itype, zone or "")
        latest[key] = max(latest.get(key, seen), seen)
    return [Unavailability(provider=prov, instance_type=itype, zone=zone, capacity_type=SPOT, reason=PREEMPTED,
                           until=seen + POOL_COOLDOWN) for (prov, itype, zone), seen in latest.items()]


def unavailable_offerings(*, team_id: int | None, provider: str | None = None, now: datetime | None = None
                          ) -> list[Unavailability]:
    """What launches skip now: every team's no-capacity marks, and the team's preemption cool-downs
    (`team_id` None: the marks alone), soonest expiry first."""
    return unavailable_offerings_for_teams(team_ids=[team_id] if team_id is not None else [], provider=provider,
                                           now=now)


def unavailable_offerings_for_teams(*, team_ids: list[int], provider: str | None = None,
                                    now: datetime | None = None) -> list[Unavailability]:
    """`unavailable_offerings` for a reader of several teams (the API, the fleet page): the marks
    once, and each team's cool-downs."""
    now = now or timezone.now()
    found = _no_capacity(provider=provider, capacity_type=None, now=now)
    for team_id in team_ids:
        found += _preempted(team_id=team_id, provider=provider, now=now)
    return sorted(found, key=lambda u: (u.until, u.pool_key))


@dataclass(frozen=True, slots=True)
class PoolUnavailability:
    """The pool keys (`Pool.key`) a launch of one team, provider and capacity type must skip."""

    no_capacity: frozenset[str]
    cooling: frozenset[str]

    def blocked(self, pool: Pool) -> bool:
        """No launch may ask this pool now: it, or its any-zone offering, said no capacity."""
        return pool.key in self.no_capacity or f"{pool.instance_type}@*" in self.no_capacity


def pool_unavailability(*, team_id: int, provider: str, capacity_type: str, now: datetime | None = None
                        ) -> PoolUnavailability:
    now = now or timezone.now()
    no_capacity = frozenset(u.pool_key for u in _no_capacity(provider=provider, capacity_type=capacity_type, now=now))
    # A preemption says nothing of on-demand capacity: the cool-down only steers spot launches.
    cooling = frozenset(u.pool_key for u in _preempted(team_id=team_id, provider=provider, now=now)) \
        if capacity_type == SPOT else frozenset()
    return PoolUnavailability(no_capacity=no_capacity, cooling=cooling)


def offerings_purge_expired(*, now: datetime | None = None, keep: timedelta = timedelta(days=1)) -> int:
    """Delete marks expired for longer than `keep` (the table stays the size of the recent market)."""
    now = now or timezone.now()
    deleted, _ = UnavailableOffering.objects.filter(until__lt=now - keep).delete()
    return deleted
