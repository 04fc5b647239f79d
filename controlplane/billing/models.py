"""The cost ledger: billing segments per instance, each at one price."""

from __future__ import annotations

from django.db import models


class PriceSource(models.TextChoices):
    SPOT = "spot", "Spot price in force"
    ON_DEMAND = "on_demand", "On-demand price"
    FALLBACK = "fallback", "No price known (priced at 0)"


class BillingSegment(models.Model):
    """A stretch of an instance's billable life at one price. A price change mid-life closes the
    segment and opens the next one, so segments of one instance never overlap and leave no gap.
    `end` is null while the segment is open."""

    instance = models.ForeignKey("fleet.Instance", on_delete=models.CASCADE, related_name="billing_segments")
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="billing_segments")
    job = models.ForeignKey(
        "jobs.TrainingJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="billing_segments"
    )
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)
    price_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    on_demand_price_per_hour = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    price_source = models.CharField(max_length=20, choices=PriceSource.choices)

    class Meta:
        ordering = ["instance", "start"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(end__isnull=True) | models.Q(end__gte=models.F("start")),
                name="billingsegment_end_after_start",
            ),
            models.UniqueConstraint(
                fields=["instance"], condition=models.Q(end__isnull=True), name="billingsegment_one_open"
            ),
        ]
        indexes = [
            models.Index(fields=["job", "start"], name="billing_job_start_idx"),
            models.Index(fields=["team", "start"], name="billing_team_start_idx"),
            models.Index(fields=["instance", "start"], name="billing_instance_start_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id} {self.start}..{self.end or 'open'} @ {self.price_per_hour}"
