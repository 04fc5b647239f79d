"""The metrics roll-up's tables (`observability.rollup`): per ledger (a table the metrics count),
how far its rows were folded; the folded counts; the rows at or below the watermark that were not
yet settled when folded and are still counted live."""

from __future__ import annotations

from django.db import models


class MetricsLedger(models.Model):
    """One row per counted table. Rows with id <= `folded_to` are in `MetricsCount` or `MetricsPending`;
    `seen_top` is the largest id the previous refresh saw (the next one folds up to there)."""

    name = models.CharField(max_length=40, primary_key=True)
    folded_to = models.BigIntegerField(default=0)
    seen_top = models.BigIntegerField(default=0)
    seen_at = models.DateTimeField(null=True, blank=True, help_text="When `seen_top` was read.")
    # Bumped by every refresh that changes the counts: a scrape that saw it change reads again.
    version = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} folded to {self.folded_to}"


class MetricsCount(models.Model):
    """A folded count of one family's label set (`labels` is a JSON list); `total` is a sum in
    integer units (microseconds for the latency histogram), 0 where the family has none."""

    family = models.CharField(max_length=40)
    labels = models.CharField(max_length=400)
    count = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["family", "labels"], name="metricscount_family_labels_unique")]

    def __str__(self) -> str:
        return f"{self.family}{self.labels} = {self.count}"


class MetricsPending(models.Model):
    """A row at or below its ledger's watermark that was not settled (it may still change) when it
    was folded: counted live by each scrape until a refresh finds it settled."""

    ledger = models.CharField(max_length=40)
    row_id = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["ledger", "row_id"], name="metricspending_ledger_row_unique")]

    def __str__(self) -> str:
        return f"{self.ledger} #{self.row_id}"
