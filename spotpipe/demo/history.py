"""Synthetic, deterministic dashboard data: a small market with a price history, and a team's
jobs with instances, billing segments, metric samples, generations (with a failed node and
re-routed work), reconfigurations and interruption notices.

Used by the screenshot command, the browser tests and the dashboard benchmark. It writes rows
directly (as a replay of history would), not through the services, because it fabricates the past:
instances are created already in their final state with their timestamps."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection

from controlplane.accounts.models import Team
from controlplane.billing.models import BillingSegment, PriceSource
from controlplane.fleet.models import (
    Instance,
    InstanceEvent,
    InterruptionNotice,
    NoticeKind,
    NoticeSource,
    NoticeStatus,
)
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import (
    JobEvent,
    JobGeneration,
    JobStatus,
    MetricSample,
    Reconfiguration,
    ReconfigurationStatus,
    TrainingJob,
)
from controlplane.market.models import Cloud, InstanceType, Region, SpotPool, SpotPrice, Zone
from controlplane.planning.plans import JobPlan, PlanPool
from runtime.config import JobConfig, resolve_strategy

# (name, on-demand USD/h, accelerator, count): real AWS shapes, rounded list prices.
INSTANCE_TYPES = [
    ("p3.2xlarge", "3.06", "V100", 1), ("p3.8xlarge", "12.24", "V100", 4), ("g5.xlarge", "1.006", "A10G", 1),
    ("g5.12xlarge", "5.672", "A10G", 4), ("g4dn.xlarge", "0.526", "T4", 1), ("g4dn.12xlarge", "3.912", "T4", 4),
    ("p4d.24xlarge", "32.77", "A100", 8), ("g6.xlarge", "0.805", "L4", 1), ("c6i.4xlarge", "0.68", "", 0),
    ("m6i.4xlarge", "0.768", "", 0),
]
ZONES = [("us-east-1a", "use1-az4"), ("us-east-1b", "use1-az6"), ("us-east-1c", "use1-az1"),
         ("us-east-1d", "use1-az2"), ("us-east-1f", "use1-az5")]
GLOBAL_BATCH = 96  # divisible by the running job's 3 pipelines x 8 micro-batches


@dataclass(frozen=True, slots=True)
class PoolRef:
    instance_type: InstanceType
    zone: Zone


def ensure_market(*, pools: int = 12) -> list[PoolRef]:
    """Create (idempotently) AWS us-east-1 with its zones and instance types; return `pools`
    (instance type x zone) pairs, cycling types over zones."""
    cloud, _ = Cloud.objects.get_or_create(code="aws", defaults={"name": "Amazon Web Services"})
    region, _ = Region.objects.get_or_create(cloud=cloud, code="us-east-1")
    zones = []
    for code, zone_id in ZONES:
        zone = Zone.objects.filter(zone_id=zone_id).first() or Zone.objects.filter(region=region, code=code).first()
        if zone is None:
            zone = Zone.objects.create(region=region, code=code, zone_id=zone_id)
        zones.append(zone)
    types = []
    for name, on_demand, accel, count in INSTANCE_TYPES:
        itype, _ = InstanceType.objects.get_or_create(
            cloud=cloud, name=name,
            defaults={"on_demand_price": Decimal(on_demand), "accelerator_name": accel, "accelerator_count": count,
                      "vcpus": 8, "memory_gib": Decimal(32)},
        )
        types.append(itype)
    result = []
    for i in range(min(pools, len(types) * len(zones))):
        result.append(PoolRef(types[i % len(types)], zones[(i // len(types) + i) % len(zones)]))
    return result


def price_rows(
    *, pools: list[PoolRef], start: datetime, end: datetime, changes_per_pool: int, seed: int = 7
) -> Iterator[tuple[int, int, datetime, Decimal]]:
    """A mean-reverting random walk per pool between 25% and 90% of on-demand, with evenly spread
    change times (jittered), as (instance_type_id, zone_id, timestamp, price)."""
    rng = random.Random(seed)
    span = (end - start).total_seconds()
    step = span / changes_per_pool
    for pool in pools:
        on_demand = float(pool.instance_type.on_demand_price or 1)
        level = rng.uniform(0.3, 0.5)
        for k in range(changes_per_pool):
            level += 0.08 * (0.4 - level) + rng.gauss(0, 0.01)
            level = min(max(level, 0.25), 0.9)
            # Whole seconds, strictly increasing: unique per pool whatever the jitter.
            at = start + timedelta(seconds=int(k * step + rng.uniform(0, step * 0.5)))
            yield pool.instance_type.pk, pool.zone.pk, at, Decimal(f"{on_demand * level:.6f}")


def load_prices(rows: Iterator[tuple[int, int, datetime, Decimal]], *, batch: int = 20000) -> int:
    """Store price rows fast (COPY on PostgreSQL, big bulk_create batches elsewhere) and record
    each pool's newest price in SpotPool, as the market loader does."""
    newest: dict[tuple[int, int], tuple[datetime, Decimal]] = {}

    def track(rows: Iterator[tuple[int, int, datetime, Decimal]]) -> Iterator[tuple[int, int, datetime, Decimal]]:
        for row in rows:
            key = (row[0], row[1])
            if key not in newest or row[2] > newest[key][0]:
                newest[key] = (row[2], row[3])
            yield row

    count = _store_prices(track(rows), batch=batch)
    for (type_id, zone_id), (at, price) in newest.items():
        pool, created = SpotPool.objects.get_or_create(
            instance_type_id=type_id, zone_id=zone_id, product="Linux/UNIX",
            defaults={"latest_timestamp": at, "latest_price": price},
        )
        if not created and pool.latest_timestamp < at:
            pool.latest_timestamp, pool.latest_price = at, price
            pool.save(update_fields=["latest_timestamp", "latest_price"])
    return count


def _store_prices(rows: Iterator[tuple[int, int, datetime, Decimal]], *, batch: int) -> int:
    count = 0
    if connection.vendor == "postgresql":
        table = SpotPrice._meta.db_table
        with connection.cursor() as cursor:
            copy_sql = f"COPY {table} (instance_type_id, zone_id, product, price, timestamp) FROM STDIN"
            with cursor.cursor.copy(copy_sql) as copy:
                for type_id, zone_id, at, price in rows:
                    copy.write_row((type_id, zone_id, "Linux/UNIX", price, at))
                    count += 1
        return count
    buffer: list[SpotPrice] = []
    for type_id, zone_id, at, price in rows:
        buffer.append(SpotPrice(instance_type_id=type_id, zone_id=zone_id, price=price, timestamp=at))
        if len(buffer) >= batch:
            SpotPrice.objects.bulk_create(buffer, ignore_conflicts=True)
            count += len(buffer)
            buffer = []
    if buffer:
        SpotPrice.objects.bulk_create(buffer, ignore_conflicts=True)
        count += len(buffer)
    return count


def _instance(team: Team, job: TrainingJob | None, pool: PoolRef, *, n: int, state: str, running_at: datetime,
              ended_at: datetime | None = None, notice_at: datetime | None = None) -> Instance:
    return Instance.objects.create(
        team=team, job=job, provider="aws", provider_instance_id=f"i-{team.pk:03x}{n:014x}",
        instance_type=pool.instance_type, zone=pool.zone, state=state, state_changed_at=ended_at or running_at,
        running_at=running_at, notice_at=notice_at, ended_at=ended_at,
        last_heartbeat_at=None if ended_at else running_at + timedelta(minutes=1),
    )


def _bill(instance: Instance, job: TrainingJob | None, start: datetime, end: datetime | None, fraction: float) -> None:
    """Two segments per instance: the price changes half-way (the ledger closes one, opens one)."""
    on_demand = instance.instance_type.on_demand_price or Decimal(1)
    middle = start + ((end or start + timedelta(hours=2)) - start) / 2
    prices = [on_demand * Decimal(str(fraction)), on_demand * Decimal(str(fraction * 1.1))]
    bounds = [(start, middle), (middle, end)]
    for (lo, hi), price in zip(bounds, prices, strict=True):
        BillingSegment.objects.create(
            instance=instance, team=instance.team, job=job, start=lo, end=hi,
            price_per_hour=price.quantize(Decimal("0.000001")), on_demand_price_per_hour=on_demand,
            price_source=PriceSource.SPOT,
        )


def _metrics(job: TrainingJob, *, steps: int, start: datetime, seconds_per_step: float, dip_at: set[int],
             generation_at: list[tuple[int, int]], rng: random.Random) -> None:
    rows = []
    for step in range(steps):
        loss = 2.0 + 8.0 * math.exp(-step / (steps / 4 + 1)) + rng.gauss(0, 0.05)
        throughput = GLOBAL_BATCH / seconds_per_step * (0.55 if any(abs(step - d) < 30 for d in dip_at) else 1.0)
        generation = max((g for s, g in generation_at if s <= step), default=1)
        rows.append(MetricSample(job=job, step=step, at=start + timedelta(seconds=step * seconds_per_step),
                                 loss=round(loss, 5), samples_per_s=round(throughput * rng.uniform(0.97, 1.03), 3),
                                 generation=generation))
        if len(rows) >= 5000:
            MetricSample.objects.bulk_create(rows)
            rows = []
    MetricSample.objects.bulk_create(rows)


def _notice_history(team: Team, *, now: datetime, rng: random.Random, count: int = 40, prefix: str = "") -> None:
    """Past notices from every source, most processed in tens of milliseconds, a few failed or
    still waiting, some for instances we do not know (they are kept and flagged)."""
    sources = [NoticeSource.AWS_EVENTBRIDGE, NoticeSource.AWS_SNS, NoticeSource.AGENT, NoticeSource.GENERIC]
    kinds = [NoticeKind.INTERRUPTION, NoticeKind.INTERRUPTION, NoticeKind.REBALANCE, NoticeKind.STATE_CHANGE]
    rows = []
    for k in range(count):
        received = now - timedelta(hours=72 * (count - k) / count) + timedelta(seconds=rng.uniform(0, 600))
        status = NoticeStatus.PROCESSED if k % 13 else NoticeStatus.FAILED
        processing = timedelta(milliseconds=rng.lognormvariate(3.3, 0.5))
        rows.append(InterruptionNotice(
            team=team, source=sources[k % len(sources)], kind=kinds[k % len(kinds)], action="terminate",
            dedup_key=f"demo-history-{team.pk}-{prefix}{k}", provider_instance_id=f"i-0old{team.pk:04x}{k:09x}",
            unknown_instance=k % 5 == 0, received_at=received, status=status, attempts=1 if k % 13 else 3,
            processed_at=received + processing if k % 13 else None,
            error="" if k % 13 else "instance lookup timed out (demo)",
        ))
    InterruptionNotice.objects.bulk_create(rows)


def _contract(model: dict, *, dp: int, pp: int, strategy: str, steps: int, pool: PoolRef,
              global_batch: int = GLOBAL_BATCH) -> dict:
    """A past job's stored contract (the runtime's JobConfig) and plan, at most 8 micro-batches per pipeline."""
    microbatches = min(8, global_batch // dp)
    while global_batch % (dp * microbatches):
        microbatches -= 1
    config = JobConfig.from_dict({"model": model, "dp": dp, "pp": pp, "global_batch": global_batch,
                                  "microbatches": microbatches, "strategy": resolve_strategy(strategy),
                                  "steps": steps})
    plan = JobPlan(provider="aws", pools=[PlanPool(instance_type=pool.instance_type.name, zone=pool.zone.code)],
                   nodes=dp * pp)
    return {"config": config.to_dict(), "plan": plan.to_dict()}


def seed_team_activity(*, team: Team, user, pools: list[PoolRef], now: datetime, metric_steps: int = 3000,
                       seed: int = 11, prefix: str = "", notice_count: int = 40) -> dict[str, TrainingJob]:
    """A running ReCycle job that lost a node to a preemption and got it back, a finished job with
    closed billing, and a pending job with no data yet. Returns them by role."""
    rng = random.Random(seed + team.pk)
    model = {"kind": "gpt", "n_layer": 24, "n_embd": 1024, "n_head": 16, "seq_len": 1024, "vocab_size": 50257}
    started = now - timedelta(hours=6)
    seconds_per_step = (6 * 3600 - 60) / metric_steps
    running = TrainingJob.objects.create(
        team=team, created_by=user, name=f"{prefix}gpt-350m-recycle", strategy="recycle",
        **_contract(model, dp=3, pp=4, strategy="recycle", steps=int(metric_steps * 1.6), pool=pools[0]),
        target_steps=int(metric_steps * 1.6), deadline=now + timedelta(hours=8), budget_usd=Decimal("250.00"),
        status=JobStatus.RUNNING, current_generation=3, steps_done=metric_steps - 1,
        samples_done=(metric_steps - 1) * GLOBAL_BATCH, started_at=started,
    )
    main_pool, other_pool = pools[0], pools[1 % len(pools)]
    nodes = []
    n = 0
    for pipeline in range(3):
        for _stage in range(4):
            n += 1
            nodes.append(_instance(team, running, main_pool if pipeline < 2 else other_pool, n=n,
                                   state=InstanceState.RUNNING, running_at=started))
    notice_at = started + timedelta(hours=2)
    victim = nodes[6]  # pipeline 1, stage 2
    victim.state, victim.notice_at = InstanceState.PREEMPTED, notice_at
    victim.ended_at = notice_at + timedelta(minutes=2)
    victim.save(update_fields=["state", "notice_at", "ended_at"])
    n += 1
    replacement = _instance(team, running, main_pool, n=n, state=InstanceState.RUNNING,
                            running_at=started + timedelta(hours=3))
    for node in nodes:
        end = victim.ended_at if node is victim else None
        _bill(node, running, started, end, fraction=0.35)
    _bill(replacement, running, replacement.running_at, None, fraction=0.36)

    def member(node: Instance, pipeline: int, stage: int) -> dict:
        return {"instance": node.pk, "rank": pipeline * 4 + stage, "pipeline": pipeline, "stage": stage}

    gen1 = [member(node, i // 4, i % 4) for i, node in enumerate(nodes)]
    gen2 = [m for m in gen1 if m["instance"] != victim.pk]
    gen3 = [*gen2, member(replacement, 1, 2)]
    layout = {"dp": 3, "pp": 4, "stage_layers": [6, 6, 6, 6], "micro_batches": 8}
    JobGeneration.objects.create(job=running, number=1, membership=gen1, layout=layout, reason="initial plan",
                                 created_at=started)
    JobGeneration.objects.create(
        job=running, number=2, membership=gen2, created_at=notice_at + timedelta(seconds=20),
        reason=f"{victim.provider_instance_id} preempted",
        layout={**layout, "reroutes": [{"from": victim.pk, "to": nodes[2].pk, "micro_batches": 4},
                                       {"from": victim.pk, "to": nodes[10].pk, "micro_batches": 4}]},
    )
    JobGeneration.objects.create(job=running, number=3, membership=gen3, layout=layout,
                                 reason="replacement joined", created_at=replacement.running_at)
    notice = InterruptionNotice.objects.create(
        team=team, source=NoticeSource.AWS_EVENTBRIDGE, kind=NoticeKind.INTERRUPTION, action="terminate",
        dedup_key=f"demo-{team.pk}-{victim.pk}", provider_instance_id=victim.provider_instance_id, instance=victim,
        event_time=notice_at, deadline=notice_at + timedelta(minutes=2), received_at=notice_at,
        status=NoticeStatus.PROCESSED, processed_at=notice_at + timedelta(milliseconds=42), attempts=1,
    )
    InterruptionNotice.objects.create(
        team=team, source=NoticeSource.AGENT, kind=NoticeKind.INTERRUPTION, action="terminate",
        dedup_key=f"demo-agent-{team.pk}-{victim.pk}", provider_instance_id=victim.provider_instance_id,
        instance=victim, received_at=notice_at + timedelta(seconds=3), status=NoticeStatus.PROCESSED,
        processed_at=notice_at + timedelta(seconds=3, milliseconds=18), attempts=1,
    )
    InterruptionNotice.objects.create(
        team=team, source=NoticeSource.AWS_SNS, kind=NoticeKind.REBALANCE, dedup_key=f"demo-rebal-{team.pk}",
        provider_instance_id=nodes[3].provider_instance_id, instance=nodes[3],
        received_at=now - timedelta(minutes=30), status=NoticeStatus.RECEIVED,
    )
    InstanceEvent.objects.create(instance=victim, kind="state", from_state=InstanceState.NOTICE,
                                 to_state=InstanceState.PREEMPTED, at=victim.ended_at)
    Reconfiguration.objects.create(
        job=running, trigger="notice", trigger_key=f"notice:{notice.pk}", strategy="recycle", decision="reroute",
        instance=victim, notice=notice, from_generation=1, to_generation=2, status=ReconfigurationStatus.APPLIED,
        lost_seconds=38.5, decided_at=notice_at + timedelta(seconds=1), applied_at=notice_at + timedelta(seconds=20),
    )
    Reconfiguration.objects.create(
        job=running, trigger="join", trigger_key=f"join:{replacement.pk}", strategy="recycle", decision="reinstantiate",
        instance=replacement, from_generation=2, to_generation=3, status=ReconfigurationStatus.APPLIED,
        lost_seconds=12.0, decided_at=replacement.running_at, applied_at=replacement.running_at + timedelta(seconds=9),
    )
    dip_step = int(2 * 3600 / seconds_per_step)
    join_step = int(3 * 3600 / seconds_per_step)
    _metrics(running, steps=metric_steps, start=started + timedelta(seconds=60), seconds_per_step=seconds_per_step,
             dip_at={dip_step}, generation_at=[(0, 1), (dip_step, 2), (join_step, 3)], rng=rng)
    for at, kind, message in [
        (started - timedelta(minutes=5), "submitted", f"submitted by {user}"),
        (started, "generation", "generation 1: 12 workers (initial plan)"),
        (notice_at, "notice", f"interruption notice for {victim.provider_instance_id}"),
        (notice_at + timedelta(seconds=20), "generation", "generation 2: 11 workers (re-routed 8 micro-batches)"),
        (replacement.running_at, "generation", "generation 3: 12 workers (replacement joined)"),
    ]:
        JobEvent.objects.create(job=running, kind=kind, message=message, at=at)

    done_start = now - timedelta(days=3)
    finished = TrainingJob.objects.create(
        team=team, created_by=user, name=f"{prefix}gpt-125m-checkpoint",
        **_contract({**model, "n_layer": 12}, dp=1, pp=4, strategy="checkpoint", steps=800, pool=pools[0]),
        strategy="checkpoint", target_steps=800, budget_usd=Decimal("40.00"), status=JobStatus.FINISHED,
        current_generation=1, steps_done=800, samples_done=800 * GLOBAL_BATCH, started_at=done_start,
        finished_at=done_start + timedelta(hours=4),
    )
    for k in range(4):
        n += 1
        pool = pools[(2 + k) % len(pools)]
        node = _instance(team, finished, pool, n=n, state=InstanceState.TERMINATED, running_at=done_start,
                         ended_at=done_start + timedelta(hours=4))
        _bill(node, finished, done_start, done_start + timedelta(hours=4), fraction=0.3 + 0.02 * k)
    JobGeneration.objects.create(
        job=finished, number=1, created_at=done_start, reason="initial plan",
        membership=[{"instance": i.pk, "rank": r, "pipeline": 0, "stage": r}
                    for r, i in enumerate(Instance.objects.filter(job=finished).order_by("id"))],
        layout={"dp": 1, "pp": 4, "stage_layers": [3, 3, 3, 3], "micro_batches": 8},
    )
    _metrics(finished, steps=800, start=done_start, seconds_per_step=4 * 3600 / 800, dip_at=set(),
             generation_at=[(0, 1)], rng=rng)
    finished.last_loss = MetricSample.objects.filter(job=finished).order_by("-step").values_list("loss", flat=True)[0]
    finished.save(update_fields=["last_loss"])
    _notice_history(team, now=now, rng=rng, count=notice_count, prefix=prefix)
    pending = TrainingJob.objects.create(
        team=team, created_by=user, name=f"{prefix}mlp-smoke-test", strategy="auto", target_steps=500,
        **_contract({"kind": "mlp", "n_layer": 4, "n_embd": 256}, dp=1, pp=1, strategy="auto", steps=500,
                    pool=pools[0], global_batch=32),
        deadline=now + timedelta(days=1), status=JobStatus.PENDING,
    )
    JobEvent.objects.create(job=pending, kind="submitted", message=f"submitted by {user}", at=now)
    return {"running": running, "finished": finished, "pending": pending}
