"""Spot price ingestion: the bulk, idempotent loader against a naive ORM loop, on SQLite and
PostgreSQL, with the real price file (33,362 rows).

For each database (a fresh SQLite file; a scratch PostgreSQL database `spotpipe_bench` on
127.0.0.1, created and dropped here) it measures, end to end from the gzipped file:
- bulk first load: `spot_prices_ingest_file` into an empty table (validation pass + multi-row
  `INSERT ... ON CONFLICT DO NOTHING` in one transaction);
- bulk re-load: the same file again (every row already present, 0 inserted);
- baseline first load / re-load: the obvious ORM loop on a sample of the same file: per row
  `SpotPrice.objects.get_or_create(...)` in autocommit (zone and type ids resolved through a dict,
  as the bulk loader does), measured in the same run;
and the ratio bulk rows/s over baseline rows/s. The market tables are created with
`migrate market` on an extra database alias, so the project's default database is never touched.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

# AWS's published spot price history of May 2022 (every region's pools), kept with the benchmark.
PRICE_FILE = Path(__file__).resolve().parent / "data" / "aws-spot-prices-2022-05.tsv.gz"
PG_DSN = os.environ.get("SPOTPIPE_BENCH_PG", "postgres://postgres@127.0.0.1:5432/postgres")
PG_BENCH_DB = "spotpipe_bench"


def requirements(*, quick: bool, **_options: object) -> list[str]:
    """What the benchmark needs that is missing: its price file (kept in the repository)."""
    return [] if PRICE_FILE.is_file() else [f"the price file {PRICE_FILE} (restore it from git)"]


def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()


def _add_alias(alias: str, config: dict[str, Any]) -> None:
    """Register an extra database alias at run time (the default database is left alone)."""
    from django.db import connections

    filled = connections.configure_settings({"default": dict(connections.settings["default"]), alias: config})
    connections.settings[alias] = filled[alias]


def _drop_alias(alias: str) -> None:
    from django.db import connections

    connections[alias].close()
    del connections[alias]
    connections.settings.pop(alias, None)


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql)


def _migrate(alias: str) -> None:
    from django.core.management import call_command

    call_command("migrate", "market", database=alias, verbosity=0, interactive=False)


def _truncate(alias: str) -> None:
    from controlplane.market.models import SpotPrice

    SpotPrice.objects.using(alias).all().delete()


def _baseline(alias: str, sample: int) -> float:
    """Rows per second of the naive loop on the first `sample` rows of the file."""
    from controlplane.market.ingest import PriceRow, iter_price_rows, open_price_file
    from controlplane.market.models import SpotPrice
    from controlplane.market.services import instance_types_ensure, zones_ensure

    started = time.perf_counter()
    with open_price_file(PRICE_FILE) as handle:
        rows = [r for r in islice(iter_price_rows(handle), sample) if isinstance(r, PriceRow)]
    zones = zones_ensure(values={r.zone for r in rows}, using=alias)
    types = instance_types_ensure(names={r.instance_type for r in rows}, using=alias)
    manager = SpotPrice.objects.using(alias)
    for r in rows:
        manager.get_or_create(
            instance_type_id=types[r.instance_type],
            zone_id=zones[r.zone],
            product=r.product,
            timestamp=r.timestamp,
            defaults={"price": r.price},
        )
    return len(rows) / (time.perf_counter() - started)


def _bulk(alias: str) -> tuple[float, int, int, int]:
    """(rows/s end to end, rows, inserted, already present) of one bulk ingestion of the file."""
    from controlplane.market.ingest import spot_prices_ingest_file

    started = time.perf_counter()
    report = spot_prices_ingest_file(path=PRICE_FILE, using=alias)
    seconds = time.perf_counter() - started
    c = report.counts
    return c.rows / seconds, c.rows, c.inserted, c.already_present


def _measure(alias: str, *, sample: int, repeats: int, progress: Any, label: str) -> dict[str, Any]:
    from controlplane.market.models import SpotPrice

    progress.step(f"{label}: baseline get_or_create on {sample} rows")
    _truncate(alias)
    base_first = _baseline(alias, sample)
    base_again = _baseline(alias, sample)
    first_rates, again_rates = [], []
    rows = inserted = present = 0
    for i in range(repeats):
        progress.step(f"{label}: bulk load of the full file", i + 1, repeats)
        _truncate(alias)
        rate, rows, inserted, _ = _bulk(alias)
        first_rates.append(rate)
        rate, _, second_inserted, present = _bulk(alias)
        again_rates.append(rate)
        assert second_inserted == 0, "the re-load must add nothing"
    stored = SpotPrice.objects.using(alias).count()
    first, again = statistics.median(first_rates), statistics.median(again_rates)
    return {
        "rows_in_file": rows,
        "rows_inserted_first_load": inserted,
        "rows_already_present_on_reload": present,
        "rows_stored": stored,
        "bulk_first_load_rows_per_s": round(first, 1),
        "bulk_reload_rows_per_s": round(again, 1),
        "baseline_sample_rows": sample,
        "baseline_first_load_rows_per_s": round(base_first, 1),
        "baseline_reload_rows_per_s": round(base_again, 1),
        "speedup_first_load": round(first / base_first, 1),
        "speedup_reload": round(again / base_again, 1),
        "repeats_median_of": repeats,
    }


def run(*, quick: bool, progress: Any) -> dict[str, Any]:
    """Measure ingestion on SQLite and PostgreSQL; print a table; return the figures."""
    from bench.report import print_table

    _django()
    sample = 500 if quick else 3000
    repeats = 1 if quick else 3
    results: dict[str, Any] = {
        "price_file": str(PRICE_FILE),
        "mode": "quick" if quick else "full",
        # Other processes on the machine depress every rate; the ratios are measured side by side.
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
    }

    with tempfile.TemporaryDirectory() as tmp:
        alias = "bench_sqlite"
        _add_alias(
            alias,
            {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(Path(tmp) / "bench.sqlite3"),
                "OPTIONS": {
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                    "transaction_mode": "IMMEDIATE",
                    "timeout": 20,
                },
            },
        )
        try:
            progress.step("sqlite: migrate market")
            _migrate(alias)
            results["sqlite"] = _measure(alias, sample=sample, repeats=repeats, progress=progress, label="sqlite")
        finally:
            _drop_alias(alias)

    alias = "bench_postgresql"
    _pg_admin(f"DROP DATABASE IF EXISTS {PG_BENCH_DB}")
    _pg_admin(f"CREATE DATABASE {PG_BENCH_DB}")
    try:
        base = PG_DSN.rsplit("/", 1)[0]
        import environ

        config = environ.Env.db_url_config(f"{base}/{PG_BENCH_DB}")
        _add_alias(alias, config)
        try:
            progress.step("postgresql: migrate market")
            _migrate(alias)
            results["postgresql"] = _measure(
                alias, sample=sample, repeats=repeats, progress=progress, label="postgresql"
            )
        finally:
            _drop_alias(alias)
    finally:
        _pg_admin(f"DROP DATABASE IF EXISTS {PG_BENCH_DB}")

    results["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    rows = []
    for db in ("sqlite", "postgresql"):
        r = results[db]
        rows.append(
            [
                db,
                "first load",
                r["bulk_first_load_rows_per_s"],
                r["baseline_first_load_rows_per_s"],
                r["speedup_first_load"],
                r["rows_inserted_first_load"],
            ]
        )
        rows.append(
            [db, "re-load", r["bulk_reload_rows_per_s"], r["baseline_reload_rows_per_s"], r["speedup_reload"], 0]
        )
    print_table(
        f"Spot price ingestion, {results['sqlite']['rows_in_file']:,} rows from {PRICE_FILE.name} "
        f"(baseline: get_or_create per row on {sample} rows; median of {repeats})",
        ["database", "pass", "bulk rows/s", "baseline rows/s", "x baseline", "inserted"],
        rows,
    )
    return results
