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


DEFAULT_CONFIG = {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 128},
                  "global_batch": 16}
# Fields a fixture may set on a stored job after it is submitted (its progress, as if it had run).
STATE_FIELDS = ("status", "status_message", "current_generation", "steps_done", "samples_done", "initial_loss",
                "last_loss", "started_at", "finished_at")


def make_job(team: Team, **overrides) -> TrainingJob:
    """A job submitted through `job_submit` (the API's service). `plan` may be given in the old
    shape some tests use: `pools` ([{instance_type, zone}]), `seed` and `runtime` (contract fields);
    `model_spec` is the API's alias; status/progress fields are set afterwards, as a run would."""
    from controlplane.jobs.services import job_submit

    plan = dict(overrides.pop("plan", None) or {"dp": 1, "pp": 1})
    model_spec = overrides.pop("model_spec", None)
    config = dict(overrides.pop("config", None) or DEFAULT_CONFIG)
    # Four micro-batches per step.
    if model_spec is None:
        plan.setdefault("microbatches", max(1, 4 // (plan.get("dp") or 1)))
    if "seed" in plan:
        config["seed"] = plan.pop("seed")
    config.update(plan.pop("runtime", None) or {})
    pools = plan.pop("pools", None)
    if pools:
        plan["instance_types"] = sorted({p["instance_type"] for p in pools})
        plan["zones"] = [p["zone"] for p in pools if p.get("zone")]
    state = {k: overrides.pop(k) for k in STATE_FIELDS if k in overrides}
    created_by = overrides.pop("created_by", None)
    if model_spec is not None:  # the alias carries the model and batch; the rest stays in the contract
        extra = {k: v for k, v in config.items() if k not in DEFAULT_CONFIG}
        config = None
        if extra:
            raise ValueError(f"make_job: give runtime fields {sorted(extra)} with config=, not model_spec=")
    fields = {"name": f"job-{next(_seq)}", "strategy": "recycle", "target_steps": 100,
              "budget_usd": Decimal("10.00"), **overrides}
    job = job_submit(team=team, user=created_by, config=config, model_spec=model_spec, plan=plan, **fields)
    if state:
        TrainingJob.objects.filter(pk=job.pk).update(**state)
        job.refresh_from_db()
    return job


def make_instance(team: Team, **overrides) -> Instance:
    fields = {"instance_type": make_instance_type(), "zone": make_zone(),
              "provider_instance_id": f"i-{next(_seq):017x}"}
    fields.update(overrides)
    return Instance.objects.create(team=team, **fields)


# --- webhooks (interruption notices) -----------------------------------------------------------


def make_webhook_credential(team: Team, source: str, scheme: str, **kwargs):
    """A webhook credential and its secret in clear."""
    from controlplane.webhooks.credentials import credential_create

    return credential_create(team=team, source=source, scheme=scheme, **kwargs)


def make_signing_cert(common_name: str = "sns.us-east-1.amazonaws.com"):
    """A locally generated RSA key and self-signed certificate (PEM bytes), standing in for SNS's."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30)).sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM)


def sns_sign(message: dict, key, *, version: str = "1") -> dict:
    """Sign an SNS message dict in place the way SNS does (SignatureVersion 1 = SHA1, 2 = SHA256)."""
    import base64

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    from controlplane.webhooks.sns import string_to_sign

    message["SignatureVersion"] = version
    digest = hashes.SHA1() if version == "1" else hashes.SHA256()
    message["Signature"] = base64.b64encode(key.sign(string_to_sign(message), padding.PKCS1v15(), digest)).decode()
    return message


def make_spot_prices(instance_type, zone, changes, product: str = "Linux/UNIX") -> list:
    """Store spot price changes [(aware datetime, "price"), ...] for one pool, through the loader
    (so the pool table is kept as in production). Returns the load counts."""
    from controlplane.market.ingest import PriceRow, spot_prices_load

    zone_key = zone.zone_id or zone.code
    return spot_prices_load(rows=[
        PriceRow(zone=zone_key, instance_type=instance_type.name, product=product, price=Decimal(str(price)),
                 timestamp=ts)
        for ts, price in changes
    ])


def make_price_file(path, lines: list[str], *, gz: bool = False):
    """Write a price file (lines joined with newlines), gzipped when `gz`; returns the path."""
    import gzip
    from pathlib import Path

    data = ("\n".join(lines) + "\n").encode()
    path = Path(path)
    if gz:
        with gzip.open(path, "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)
    return path
