"""`python manage.py ingest_spot_prices PATH [PATH...] [--skip-bad]`: load spot price history files."""

from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand, CommandError

from controlplane.market.ingest import PriceFileRejected, spot_prices_ingest_file
from controlplane.market.services import spot_pools_rebuild


class Command(BaseCommand):
    help = (
        "Load spot price history (zone, instance type, product, price, timestamp) from TSV/CSV files, "
        "with or without header, plain or gzipped. Idempotent. A file with bad rows is not loaded at all "
        "unless --skip-bad is given."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("paths", nargs="*", help="price files (.tsv, .csv, optionally .gz)")
        parser.add_argument(
            "--rebuild-pools", action="store_true",
            help="rebuild the pool table from the stored history (after writes not made by the loader)",
        )
        parser.add_argument("--skip-bad", action="store_true", help="load the good rows and report the bad ones")
        parser.add_argument("--batch-size", type=int, default=2000, help="rows per write batch")

    def handle(self, *args, **options) -> None:
        if not options["paths"] and not options["rebuild_pools"]:
            raise CommandError("name at least one price file (or pass --rebuild-pools)")
        rejected = []
        for path in options["paths"]:
            last = [0.0]

            def progress(done: int, elapsed: float, path: str = path, last: list[float] = last) -> None:
                now = time.monotonic()
                if now - last[0] >= 1.0:
                    last[0] = now
                    rate = done / elapsed if elapsed > 0 else 0.0
                    sys.stderr.write(f"{path}: {done:,} rows, {rate:,.0f} rows/s\n")
                    sys.stderr.flush()

            try:
                report = spot_prices_ingest_file(
                    path=path, skip_bad=options["skip_bad"], batch_size=options["batch_size"], progress=progress
                )
            except FileNotFoundError:
                raise CommandError(f"{path}: no such file") from None
            except PriceFileRejected as exc:
                rejected.append(path)
                self.stderr.write(str(exc))
                for bad in exc.report.bad_rows:
                    self.stderr.write(f"  line {bad.line}: {bad.reason}")
                continue
            counts = report.counts
            self.stdout.write(
                f"{path}: {counts.rows:,} rows read, {counts.inserted:,} inserted, "
                f"{counts.already_present:,} already present, {len(report.bad_rows)} bad skipped "
                f"({counts.seconds:.2f} s, {counts.rows_per_second:,.0f} rows/s)"
            )
            for bad in report.bad_rows:
                self.stderr.write(f"  skipped line {bad.line}: {bad.reason}")
        if options["rebuild_pools"]:
            self.stdout.write(f"pools rebuilt: {spot_pools_rebuild():,}")
        if rejected:
            raise CommandError(f"{len(rejected)} file(s) rejected for bad rows (nothing of them loaded): "
                               + ", ".join(rejected) + "; use --skip-bad to load their good rows")
