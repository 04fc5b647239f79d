"""Dashboard data endpoints on a big PostgreSQL database: p50/p95 latency of every page's JSON
endpoint, against the same data served without downsampling (measured in the same run).

A scratch database `spotpipe_bench_dashboard` on 127.0.0.1 is created, migrated and loaded:
- spot prices: 1,000,000 rows (quick: 60,000) over 90 days in 40 pools, loaded with COPY;
- one big job with 100,000 metric samples (quick: 10,000) and its history (instances, billing
  segments, 3 generations, reconfigurations), plus a finished and a pending job;
- 2,000 interruption notices for the team (quick: 200), and five other teams with their own
  demo history (so every query has to filter by team on a table shared with others).
Requests go through Django's test client (the whole view stack, session auth, JSON encoding; no
socket), logged in as the big team's member, DEBUG off. The database is dropped at the end.

Targets (issue 7): p95 of every page's data endpoint under 150 ms on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta
from typing import Any

ADMIN_DSN = os.environ.get("SPOTPIPE_BENCH_PG", "postgres://postgres@127.0.0.1:5432/postgres")
BENCH_DB = "spotpipe_bench_dashboard"
TARGET_P95_MS = 150.0
POOLS = 40


def parse_args(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench dashboard")
    parser.add_argument("--prices", type=int, help="spot price rows (default 1,000,000; quick 60,000)")
    parser.add_argument("--metrics", type=int, help="metric samples of the big job (default 100,000; quick 10,000)")
    parser.add_argument("--requests", type=int, help="timed requests per endpoint (default 60; quick 15)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database afterwards")
    parser.add_argument("--reuse", action="store_true", help="time a database kept by an earlier --keep run")
    return vars(parser.parse_args(argv))


def _db_url(name: str) -> str:
    return ADMIN_DSN.rsplit("/", 1)[0] + "/" + name


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def _setup_django() -> None:
    """Point Django at the scratch database before it reads its settings."""
    import django
    from django.conf import settings

    if settings.configured and "django.contrib.admin" in getattr(settings, "INSTALLED_APPS", []):
        raise RuntimeError("run the dashboard benchmark in its own process (python -m bench dashboard)")
    os.environ["DATABASE_URL"] = _db_url(BENCH_DB)
    os.environ["DEBUG"] = "false"  # no query log: the timings are those of a production process
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    django.setup()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _time(call: Any, *, warmup: int, repeats: int) -> dict[str, float]:
    for _ in range(warmup):
        call()
    samples = []
    size = 0
    for _ in range(repeats):
        start = time.perf_counter()
        size = call()
        samples.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": statistics.median(samples), "p95_ms": _percentile(samples, 95), "max_ms": max(samples),
            "bytes": size}


def _load(*, prices: int, metrics: int, notices: int, progress: Any) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from controlplane.accounts.models import Membership, Role, Team
    from spotpipe.demo import history as demo_history

    now = timezone.now()
    pools = demo_history.ensure_market(pools=POOLS)
    per_pool = prices // len(pools)
    started = time.perf_counter()
    progress.step(f"loading {per_pool * len(pools):,} spot price rows with COPY")
    loaded = demo_history.load_prices(demo_history.price_rows(pools=pools, start=now - timedelta(days=90), end=now,
                                                        changes_per_pool=per_pool))
    price_s = time.perf_counter() - started
    users = get_user_model()
    others = []
    for k in range(5):
        team = Team.objects.create(name=f"Other {k}", slug=f"other-{k}")
        user = users.objects.create_user(username=f"other{k}", password="x" * 12)
        Membership.objects.create(team=team, user=user, role=Role.MEMBER)
        others.append((team, user))
    progress.step(f"seeding the big team: {metrics:,} metric samples, {notices:,} notices")
    started = time.perf_counter()
    team = Team.objects.create(name="Bench", slug="bench")
    user = users.objects.create_user(username="bench", password="x" * 12)
    Membership.objects.create(team=team, user=user, role=Role.ADMIN)
    jobs = demo_history.seed_team_activity(team=team, user=user, pools=pools, now=now, metric_steps=metrics,
                                        notice_count=notices)
    for k, (other, other_user) in enumerate(others):
        demo_history.seed_team_activity(team=other, user=other_user, pools=pools, now=now, metric_steps=2000,
                                     seed=100 + k, notice_count=notices // 5)
    seed_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    # The hourly price roll-up is built once after a big load (later refreshes fold only new
    # rows); timed here so the endpoint timings below are those of a steady state.
    from controlplane.market.rollup import price_rollup_refresh

    progress.step("building the hourly price roll-up")
    started = time.perf_counter()
    price_rollup_refresh()
    rollup_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("SELECT count(*) FROM market_spotprice")
        price_rows = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM jobs_metricsample")
        metric_rows = cursor.fetchone()[0]
    return {"user": user, "jobs": jobs, "pools": pools, "loaded": loaded, "price_rows": price_rows,
            "metric_rows": metric_rows, "price_load_s": price_s, "seed_s": seed_s, "rollup_s": rollup_s}


def _existing() -> dict[str, Any]:
    """The world of a database loaded by an earlier run (`--keep`), for `--reuse`."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlplane.jobs.models import TrainingJob
    from spotpipe.demo import history as demo_history

    jobs = {role: TrainingJob.objects.get(team__slug="bench", name=name) for role, name in
            (("running", "gpt-350m-recycle"), ("finished", "gpt-125m-checkpoint"), ("pending", "mlp-smoke-test"))}
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM market_spotprice")
        price_rows = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM jobs_metricsample")
        metric_rows = cursor.fetchone()[0]
    return {"user": get_user_model().objects.get(username="bench"), "jobs": jobs,
            "pools": demo_history.ensure_market(pools=POOLS), "loaded": 0, "price_rows": price_rows,
            "metric_rows": metric_rows, "price_load_s": 0.0, "seed_s": 0.0, "rollup_s": 0.0}


def _baselines(world: dict[str, Any], *, warmup: int, repeats: int) -> dict[str, dict[str, float]]:
    """The same series served the obvious way: every stored row, serialised to JSON."""
    from django.core.serializers.json import DjangoJSONEncoder
    from django.utils import timezone

    from controlplane.jobs.models import MetricSample
    from controlplane.market.selectors import spot_price_history
    from frontend import selectors

    now = timezone.now()
    cheapest = selectors.pools_now(at=now)

    def raw_prices(pools: list, days: int) -> int:
        series = []
        for pool in pools:
            points = spot_price_history(instance_type=pool.instance_type_id, zone=pool.zone_id,
                                        start=now - timedelta(days=days), end=now)
            series.append({"x": [p.at for p in points], "y": [float(p.price) for p in points]})
        return len(json.dumps(series, cls=DjangoJSONEncoder))

    def raw_metrics() -> int:
        rows = list(MetricSample.objects.filter(job=world["jobs"]["running"]).order_by("step")
                    .values_list("step", "loss", "samples_per_s", "at"))
        return len(json.dumps({"step": [r[0] for r in rows], "loss": [r[1] for r in rows],
                               "samples_per_s": [r[2] for r in rows], "at": [r[3] for r in rows]},
                              cls=DjangoJSONEncoder))

    # The raw series take seconds each: fewer repeats (the medians are stable at that scale).
    few = max(3, repeats // 6)
    return {
        "prices_default": _time(lambda: raw_prices(cheapest[:3], 14), warmup=1, repeats=few),
        "prices_90d_8_pools": _time(lambda: raw_prices(cheapest[:8], 90), warmup=1, repeats=few),
        "job": _time(raw_metrics, warmup=1, repeats=few),
    }


def run(*, quick: bool, progress: Any, prices: int | None = None, metrics: int | None = None,
        requests: int | None = None, keep: bool = False, reuse: bool = False) -> dict[str, Any]:
    from bench.report import print_table

    prices = prices or (60_000 if quick else 1_000_000)
    metrics = metrics or (10_000 if quick else 100_000)
    notices = 200 if quick else 2000
    repeats = requests or (15 if quick else 60)
    warmup = 3
    if not reuse:
        progress.step(f"creating scratch database {BENCH_DB}")
        _admin(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        _admin(f"CREATE DATABASE {BENCH_DB}")
    try:
        _setup_django()
        from django.core.management import call_command
        from django.db import connections
        from django.test import Client
        from django.urls import reverse

        if reuse:
            world = _existing()
        else:
            progress.step("migrating")
            call_command("migrate", verbosity=0, interactive=False)
            world = _load(prices=prices, metrics=metrics, notices=notices, progress=progress)
        client = Client()
        client.force_login(world["user"])
        running, finished = world["jobs"]["running"], world["jobs"]["finished"]
        every_pool = [f"{p.instance_type.pk}-{p.zone.pk}" for p in world["pools"][:8]]
        endpoints = {
            "overview": (reverse("frontend:overview-data"), {}),
            "prices_default": (reverse("frontend:prices-data"), {}),
            "prices_90d_8_pools": (reverse("frontend:prices-data"), {"days": "90", "pool": every_pool}),
            "fleet": (reverse("frontend:fleet-data"), {}),
            "jobs": (reverse("frontend:jobs-data"), {}),
            "job": (reverse("frontend:job-data", args=[running.pk]), {}),
            "job_cost": (reverse("frontend:job-cost-data", args=[running.pk]), {}),
            "job_cost_finished": (reverse("frontend:job-cost-data", args=[finished.pk]), {}),
            "notices": (reverse("frontend:notices-data"), {}),
        }
        load_before = os.getloadavg()[0]

        def call(url: str, params: dict) -> int:
            response = client.get(url, params)
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}: {response.content[:200]!r}")
            return len(response.content)

        for url, params in endpoints.values():
            for _ in range(warmup):
                call(url, params)
        # Round-robin over the endpoints, so a burst of load from other processes on the machine
        # lands on all of them alike instead of on whichever endpoint was being timed.
        wall: dict[str, list[float]] = {name: [] for name in endpoints}
        cpu: dict[str, list[float]] = {name: [] for name in endpoints}
        size: dict[str, int] = {}
        for r in range(repeats):
            progress.step("timing every endpoint", r + 1, repeats)
            for name, (url, params) in endpoints.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                size[name] = call(url, params)
                wall[name].append((time.perf_counter() - started) * 1000)
                cpu[name].append((time.process_time() - cpu_started) * 1000)
        results: dict[str, dict[str, float]] = {
            name: {"p50_ms": statistics.median(wall[name]), "p95_ms": _percentile(wall[name], 95),
                   "max_ms": max(wall[name]), "cpu_p50_ms": statistics.median(cpu[name]), "bytes": size[name]}
            for name in endpoints
        }
        load_after = os.getloadavg()[0]
        progress.step("timing baselines (no downsampling)")
        baselines = _baselines(world, warmup=warmup, repeats=repeats)
        connections.close_all()
    finally:
        if not keep and not reuse:
            _admin(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")

    rows = []
    for name, r in results.items():
        rows.append([name, r["p50_ms"], r["p95_ms"], r["max_ms"], r["cpu_p50_ms"], r["bytes"],
                     "yes" if r["p95_ms"] < TARGET_P95_MS else "NO"])
    print_table(
        f"Dashboard data endpoints on PostgreSQL: {world['price_rows']:,} spot prices, {world['metric_rows']:,} "
        f"metric samples ({repeats} requests each, Django test client, DEBUG off)",
        ["endpoint", "p50 ms", "p95 ms", "max ms", "web CPU p50 ms", "bytes", f"p95 < {TARGET_P95_MS:.0f} ms"],
        rows,
    )
    base_rows = []
    for name, b in baselines.items():
        ours = results[name]
        base_rows.append([name, b["p50_ms"], ours["p50_ms"], b["p50_ms"] / ours["p50_ms"], b["bytes"], ours["bytes"],
                          b["bytes"] / max(ours["bytes"], 1)])
    print_table(
        "Against the same series without downsampling (every row fetched and serialised; same run)",
        ["series", "raw p50 ms", "endpoint p50 ms", "speed-up", "raw bytes", "endpoint bytes", "size ratio"],
        base_rows,
    )
    worst = max(r["p95_ms"] for r in results.values())
    print(f"\nworst p95: {worst:.1f} ms -> target p95 < {TARGET_P95_MS:.0f} ms "
          f"{'met' if worst < TARGET_P95_MS else 'NOT met'} on every endpoint"
          f"{'' if worst < TARGET_P95_MS else ' (see the table)'}")
    print(f"machine load average (1 min) while timing: {load_before:.1f} before, {load_after:.1f} after, on "
          f"{os.cpu_count()} cores (other processes compete for the CPU when it exceeds the cores)")
    print(f"load: {world['loaded']:,} price rows by COPY in {world['price_load_s']:.1f} s; "
          f"seeding {world['seed_s']:.1f} s; building the hourly price roll-up once {world['rollup_s']:.1f} s")
    return {
        "price_rows": world["price_rows"], "metric_rows": world["metric_rows"], "requests_per_endpoint": repeats,
        "endpoints": results, "baselines": baselines, "worst_p95_ms": worst, "target_p95_ms": TARGET_P95_MS,
        "target_met": worst < TARGET_P95_MS, "price_load_s": world["price_load_s"], "seed_s": world["seed_s"],
        "rollup_build_s": world["rollup_s"], "load_average": [load_before, load_after],
    }
