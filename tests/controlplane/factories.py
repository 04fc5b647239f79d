"""Small helpers that create consistent test objects (plain functions, no factory library)."""

from __future__ import annotations

import itertools
from decimal import Decimal

from django.contrib.auth import get_user_model

from controlplane.accounts.models import Membership, Role, Team
from controlplane.fleet.models import Instance
from controlplane.jobs.models import TrainingJob
from controlplane.market.models import Cloud, InstanceType, Region, Zone

_seq = itertools.count(1)


def make_team(slug: str | None = None) -> Team:
    slug = slug or f"team-{next(_seq)}"
    return Team.objects.create(name=slug.title(), slug=slug)


def make_user(team: Team | None = None, *, role: str = Role.MEMBER, username: str | None = None):
    user = get_user_model().objects.create_user(
        username=username or f"user{next(_seq)}", password="correct-horse-battery-staple"
    )
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


def make_instance_type(name: str = "p3.2xlarge", on_demand: str = "3.06") -> InstanceType:
    cloud, _ = Cloud.objects.get_or_create(code="aws", defaults={"name": "Amazon Web Services"})
    itype, _ = InstanceType.objects.get_or_create(
        cloud=cloud,
        name=name,
        defaults={"vcpus": 8, "memory_gib": Decimal(61), "accelerator_name": "V100",
                  "accelerator_count": 1, "on_demand_price": Decimal(on_demand)},
    )
    return itype


def make_zone(code: str = "us-east-1a", zone_id: str | None = "use1-az4") -> Zone:
    cloud, _ = Cloud.objects.get_or_create(code="aws", defaults={"name": "Amazon Web Services"})
    region, _ = Region.objects.get_or_create(cloud=cloud, code=code[:-1])
    zone, _ = Zone.objects.get_or_create(region=region, code=code, defaults={"zone_id": zone_id})
    return zone


def make_job(team: Team, **overrides) -> TrainingJob:
    fields = {
        "name": f"job-{next(_seq)}",
        "model_spec": {"kind": "gpt", "layers": 4, "d_model": 64, "heads": 4, "seq_len": 32,
                       "vocab": 128, "global_batch": 16, "micro_batches": 4},
        "strategy": "recycle",
        "target_steps": 100,
        "budget_usd": Decimal("10.00"),
    }
    fields.update(overrides)
    return TrainingJob.objects.create(team=team, **fields)


def make_instance(team: Team, **overrides) -> Instance:
    fields = {"instance_type": make_instance_type(), "zone": make_zone(),
              "provider_instance_id": f"i-{next(_seq):017x}"}
    fields.update(overrides)
    return Instance.objects.create(team=team, **fields)
