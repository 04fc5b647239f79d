"""The Prometheus scrape (`GET /metrics`) against history: how one scrape's cost grows with rows.

`python -m bench metrics [--quick] [--json PATH] [--sizes 10000,100000] [--tail 1000] [--keep]`
fills a scratch PostgreSQL database (`spotpipe_h66_bench` on 127.0.0.1, created and dropped here)
with a year-like history of N interruption notices (N = 10k, 100k, 1M; quick: 10k, 100k): six
sources, nearly all processed (1 in 10,000 failed, the newest 50 still received or enqueued), one
instance per notice (terminated or preempted; the newest 1,000 running), one applied
reconfiguration per notice (four strategies) with the generation it produced 0.5 s to 45 s later,
over 20 jobs. Rows go in with `INSERT ... SELECT generate_series` (explicit ids) and the tables are
`VACUUM ANALYZE`d after each fill, as autovacuum would have done on a live system.

At each N it times `controlplane.observability.metrics.render()` (the whole exposition text, what
the endpoint answers; median of several scrapes) and, as the baseline, `full_recount_render()`
(every figure counted from every row, which was the endpoint before the roll-up); between fills the
metrics roll-up (`metrics_rollup_refresh`, run twice as beat would: the first run notes the newest
ids, the second, timed, folds up to them) folds the history except the newest `--tail` rows of each
table, which the scrape reads live, as it does between two roll-ups on a busy fleet. Prints
a table with the ratio to the baseline and each column's growth exponent in N (log-log least
squares). Plot: `var/bench/metrics/`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.report import growth_exponent

ADMIN_DSN = os.environ.get("SPOTPIPE_BENCH_PG", "postgres://postgres@127.0.0.1:5432/postgres")
BENCH_DB = "spotpipe_h66_bench"
SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
JOBS = 20
RUNNING = 1000  # the newest instances are the running fleet
IN_FLIGHT = 50  # the newest notices are still received or enqueued
SPACING_S = 30  # one notice every 30 s: 1M notices is a year
OUT_DIR = Path("var/bench/metrics")
TABLES = ("fleet_interruptionnotice", "fleet_instance", "jobs_jobgeneration", "jobs_reconfiguration")


def parse_args(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench metrics")
    parser.add_argument("--sizes", help="comma-separated notice counts (default 10000,100000,1000000)")
    parser.add_argument("--tail", type=int, default=1000,
                        help="newest rows of each table left past the roll-up's watermark (default 1000)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database afterwards")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
    return {"sizes": sizes, "tail": args.tail, "keep": args.keep}


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def _setup_django() -> None:
    import django

    os.environ["DATABASE_URL"] = ADMIN_DSN.rsplit("/", 1)[0] + "/" + BENCH_DB
    os.environ["DEBUG"] = "false"  # no query log: the timings are those of a production process
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    django.setup()


def _world() -> dict[str, Any]:
    """A team, an instance type and the jobs the history belongs to (through the real services)."""
    from controlplane.accounts.models import Team
    from controlplane.jobs.services import job_submit
    from spotpipe.demo import history as demo_history

    pool = demo_history.ensure_market(pools=1)[0]
    team = Team.objects.create(name="Bench", slug="bench")
    jobs = []
    for k in range(JOBS):
        job = job_submit(
            team=team, user=None, name=f"metrics-bench-{k}", strategy="recycle", target_steps=1000, budget_usd=10,
            allow_over_budget=True,
            config={"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8},
            plan={"dp": 1, "pp": 1, "provider": "local"},
        )
        jobs.append(job.pk)
    return {"team": team.pk, "instance_type": pool.instance_type.pk, "jobs": jobs}


def _fill(world: dict[str, Any], lo: int, hi: int, total: int) -> None:
    """Rows for notices lo..hi-1 (ids), dated so that notice `total` is now."""
    from django.db import connection

    jobs = world["jobs"]
    params = {"lo": lo, "hi": hi - 1, "total": total, "team": world["team"], "itype": world["instance_type"],
              "jobs": len(jobs), "job0": jobs[0], "spacing": SPACING_S, "in_flight": IN_FLIGHT,
              "running": RUNNING}
    at = "now() - make_interval(secs => (%(total)s - i) * %(spacing)s)"
    job = "(%(job0)s + i %% %(jobs)s)"
    with connection.cursor() as cur:
        # Rows that were the newest before this fill have moved on since.
        cur.execute("UPDATE fleet_interruptionnotice SET status = 'processed', processed_at = received_at "
                    "WHERE status IN ('received', 'enqueued') AND id < %(lo)s", params)
        cur.execute("UPDATE fleet_instance SET state = 'terminated', ended_at = now() "
                    "WHERE state = 'running' AND id < %(lo)s", params)
        cur.execute(f"""
            INSERT INTO fleet_instance (id, created_at, updated_at, provider, provider_instance_id, lifecycle, state,
                                        agent_address, instance_type_id, team_id, job_id, running_at, ended_at)
            SELECT i, {at}, {at}, 'aws', 'i-bench-' || i, 'spot',
                   CASE WHEN i > %(total)s - %(running)s THEN 'running'
                        WHEN i %% 3 = 0 THEN 'preempted' ELSE 'terminated' END,
                   '', %(itype)s, %(team)s, {job}, {at}, {at}
            FROM generate_series(%(lo)s, %(hi)s) AS i""", params)
        cur.execute(f"""
            INSERT INTO fleet_interruptionnotice (id, team_id, source, kind, action, dedup_key, cloud_event_id,
                provider_instance_id, instance_id, unknown_instance, received_at, status, processed_at, attempts,
                error, payload)
            SELECT i, %(team)s,
                   (ARRAY['aws_eventbridge','aws_eventbridge','aws_eventbridge','aws_eventbridge','aws_eventbridge',
                          'aws_eventbridge','aws_sns','gcp','gcp','azure'])[1 + i %% 10],
                   'interruption', 'terminate', 'bench-' || i, '', 'i-bench-' || i, i, false, {at},
                   CASE WHEN i > %(total)s - %(in_flight)s THEN (CASE WHEN i %% 2 = 0 THEN 'received'
                                                                      ELSE 'enqueued' END)
                        WHEN i %% 10000 = 9999 THEN 'failed' ELSE 'processed' END,
                   {at}, 1, '', '{{}}'::jsonb
            FROM generate_series(%(lo)s, %(hi)s) AS i""", params)
        latency = "make_interval(secs => 0.5 + (i %% 97) * 0.05 + CASE WHEN i %% 50 = 0 THEN 40 ELSE 0 END)"
        cur.execute(f"""
            INSERT INTO jobs_jobgeneration (id, job_id, number, membership, layout, reason, created_at)
            SELECT i, {job}, i / %(jobs)s + 1, '[]'::jsonb, '{{}}'::jsonb, 'notice', {at} + {latency}
            FROM generate_series(%(lo)s, %(hi)s) AS i""", params)
        cur.execute(f"""
            INSERT INTO jobs_reconfiguration (id, job_id, trigger, trigger_key, strategy, decision, decision_input,
                instance_id, notice_id, from_generation, to_generation, status, lost_seconds, decided_at, applied_at)
            SELECT i, {job}, 'notice', 'n' || i,
                   (ARRAY['recycle','recycle','bamboo','oobleck','checkpoint'])[1 + i %% 5],
                   (ARRAY['reroute','takeover','reinstantiate','reinstantiate','restart'])[1 + i %% 5],
                   '{{}}'::jsonb, i, i, i / %(jobs)s, i / %(jobs)s + 1, 'applied', 0, {at}, {at} + {latency}
            FROM generate_series(%(lo)s, %(hi)s) AS i""", params)
        for table in TABLES:
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %(hi)s)", params)
    # Outside a transaction: VACUUM cannot run in one (autocommit is on outside atomic blocks).
    with connection.cursor() as cur:
        for table in TABLES:
            cur.execute(f"VACUUM ANALYZE {table}")


def _time_ms(call: Any, repeats: int) -> float:
    call()  # warm: plans and the connection
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _rollup() -> Any:
    """The roll-up's refresh, where this checkout has one."""
    try:
        from controlplane.observability import rollup
    except ImportError:
        return None
    # Beat's refreshes are a period apart; here they run back to back on rows already committed.
    rollup.MIN_LAG_S = 0.0
    return rollup.metrics_rollup_refresh


def _baseline() -> Any:
    try:
        from controlplane.observability.metrics import full_recount_render
    except ImportError:
        return None
    return full_recount_render


def run(*, quick: bool, progress: Any, sizes: tuple[int, ...] | None = None, tail: int = 1000,
        keep: bool = False) -> dict[str, Any]:
    sizes = tuple(sorted(sizes or (QUICK_SIZES if quick else SIZES)))
    _admin(f"DROP DATABASE IF EXISTS {BENCH_DB}")
    _admin(f"CREATE DATABASE {BENCH_DB}")
    figures: dict[str, Any] = {
        "database": f"PostgreSQL, scratch database {BENCH_DB}",
        "history": "per notice: 1 notice, 1 instance, 1 applied reconfiguration, 1 generation; "
                   f"{JOBS} jobs, {RUNNING} running instances, {IN_FLIGHT} notices in flight",
        "tail_rows_past_watermark": tail,
        # Other processes on the machine slow every figure; the ratios are measured side by side.
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
        "cases": [],
    }
    try:
        _setup_django()
        from django.core.management import call_command

        from controlplane.observability.metrics import render

        progress.step("migrate")
        call_command("migrate", verbosity=0, interactive=False)
        world = _world()
        rollup, baseline = _rollup(), _baseline()
        filled = 0
        for n in sizes:
            repeats = 3 if n >= 1_000_000 else 5
            folded_to = max(filled, n - tail) if rollup else n
            case: dict[str, Any] = {"notices": n, "rows_all_tables": 4 * n}
            progress.step(f"filling to {n:,} notices ({4 * n:,} rows in four tables)")
            started = time.perf_counter()
            _fill(world, filled + 1, folded_to + 1, n)
            if rollup:
                rollup()  # beat's first period: the refresh notes the newest ids (and folds what it saw before)
                t0 = time.perf_counter()
                case["rollup_rows_folded"] = sum(rollup().values())  # the next period folds up to them
                case["rollup_refresh_s"] = round(time.perf_counter() - t0, 2)
                case["rows_folded_up_to_notice_id"] = folded_to
                if folded_to < n:
                    _fill(world, folded_to + 1, n + 1, n)
            case["fill_s"] = round(time.perf_counter() - started, 1)
            filled = n
            progress.step(f"{n:,} notices: timing the scrape (median of {repeats})")
            case["scrape_ms"] = round(_time_ms(render, repeats), 1)
            case["scrape_bytes"] = len(render())
            if baseline:
                progress.step(f"{n:,} notices: timing the full recount (median of {repeats})")
                case["baseline_full_recount_ms"] = round(_time_ms(baseline, repeats), 1)
                case["scrape_vs_baseline"] = round(case["scrape_ms"] / case["baseline_full_recount_ms"], 4)
                case["identical_exposition"] = render() == baseline()
            figures["cases"].append(case)
    finally:
        from django.db import connections

        connections.close_all()
        if not keep:
            _admin(f"DROP DATABASE IF EXISTS {BENCH_DB}")
    figures["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    cases = figures["cases"]
    figures["growth_exponent_scrape_ms_vs_notices"] = _round(growth_exponent(
        [(c["notices"], c["scrape_ms"]) for c in cases]))
    if baseline:
        figures["growth_exponent_baseline_ms_vs_notices"] = _round(growth_exponent(
            [(c["notices"], c["baseline_full_recount_ms"]) for c in cases]))
    _print(figures, baseline is not None, rollup is not None)
    figures["plots"] = _plot(cases, baseline is not None)
    for kind, path in figures["plots"].items():
        print(f"plot {kind}: {path}")
    return figures


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _print(figures: dict[str, Any], with_baseline: bool, with_rollup: bool) -> None:
    from bench.report import print_table

    headers = ["notices", "rows (4 tables)", "scrape ms"]
    if with_baseline:
        headers += ["baseline: full recount ms", "x baseline", "same text"]
    if with_rollup:
        headers += ["rows folded", "roll-up s"]
    rows = []
    for c in figures["cases"]:
        row = [f"{c['notices']:,}", f"{c['rows_all_tables']:,}", c["scrape_ms"]]
        if with_baseline:
            row += [c["baseline_full_recount_ms"], c["scrape_vs_baseline"], c["identical_exposition"]]
        if with_rollup:
            row += [f"{c['rollup_rows_folded']:,}", c["rollup_refresh_s"]]
        rows.append(row)
    title = "GET /metrics render() on PostgreSQL vs history (median of 5 scrapes, 3 at 1M)"
    if with_rollup:
        title += f"; the newest {figures['tail_rows_past_watermark']:,} rows of each table past the roll-up"
    print_table(title, headers, rows)
    exponents = [["scrape", figures["growth_exponent_scrape_ms_vs_notices"]]]
    if with_baseline:
        exponents.append(["baseline: full recount", figures["growth_exponent_baseline_ms_vs_notices"]])
    print_table("growth exponent of scrape time in notices (log-log least squares)", ["", "exponent"], exponents)
    print(f"load average (1 min): {figures['load_average_1m_at_start']} at start, "
          f"{figures['load_average_1m_at_end']} at end, on {figures['cpu_count']} CPUs (a shared machine)")


def _plot(cases: list[dict[str, Any]], with_baseline: bool) -> dict[str, str]:
    import plotly.graph_objects as go

    from runtime.sim.plots import write_figure

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    fig = go.Figure()
    xs = [c["notices"] for c in cases]
    fig.add_trace(go.Scatter(x=xs, y=[c["scrape_ms"] for c in cases], mode="lines+markers", name="scrape"))
    if with_baseline:
        fig.add_trace(go.Scatter(x=xs, y=[c["baseline_full_recount_ms"] for c in cases], mode="lines+markers",
                                 name="baseline: full recount"))
    fig.update_layout(title="GET /metrics: one scrape vs notices in the history", xaxis_title="notices",
                      yaxis_title="ms per scrape", xaxis_type="log", yaxis_type="log")
    return write_figure(fig, OUT_DIR, "scrape_vs_history")
