"""`python manage.py metrics_rollup [--rebuild]`: fold the metrics roll-up now, or start it over."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from controlplane.observability.rollup import metrics_rollup_rebuild, metrics_rollup_refresh


class Command(BaseCommand):
    help = ("Fold new notices, instances and reconfigurations into the /metrics roll-up now (beat does it "
            "every SPOTPIPE_METRICS_ROLLUP_PERIOD_S). --rebuild forgets the folded counts first, so the "
            "history is folded again: after rows were deleted, or when the latency buckets changed.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--rebuild", action="store_true", help="forget the folded counts and fold again")

    def handle(self, *args, rebuild: bool = False, **options) -> None:
        if rebuild:
            metrics_rollup_rebuild()
            self.stdout.write("metrics roll-up reset: every ledger folds its history again")
        # Lagged, as beat runs it: a row whose insert has not committed yet is never skipped.
        moved = metrics_rollup_refresh()
        self.stdout.write("folded past the watermark: " + ", ".join(f"{k} {v}" for k, v in moved.items()))
