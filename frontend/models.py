"""The dashboard's own derived data: an hourly roll-up of the spot price history, so that charts of
weeks or months read thousands of rows instead of millions. It is a cache of `market.SpotPrice`,
never a source of truth: `frontend.rollup` rebuilds or extends it from the price table."""

from __future__ import annotations

from django.db import models


class PriceHour(models.Model):
    """The price changes of one pool (instance type x zone x product) within one UTC hour:
    how many, their sum (for the mean), lowest and highest."""

    instance_type = models.ForeignKey("market.InstanceType", on_delete=models.CASCADE, related_name="+")
    zone = models.ForeignKey("market.Zone", on_delete=models.CASCADE, related_name="+")
    product = models.CharField(max_length=40)
    hour = models.DateTimeField(help_text="Start of the UTC hour.")
    hour_index = models.IntegerField(help_text="Hours since 1970-01-01 UTC: buckets are integer divisions of it.")
    changes = models.PositiveIntegerField()
    total = models.DecimalField(max_digits=18, decimal_places=6, help_text="Sum of the prices, for the mean.")
    low = models.DecimalField(max_digits=12, decimal_places=6)
    high = models.DecimalField(max_digits=12, decimal_places=6)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["instance_type", "zone", "product", "hour_index"], name="pricehour_pool_hour_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.instance_type_id}@{self.zone_id} {self.hour:%Y-%m-%d %H}:00 x{self.changes}"


class PriceRollupState(models.Model):
    """How far the roll-up has read the price table: every SpotPrice with id <= `last_price_id` is
    counted in PriceHour. One row (pk=1); locked while the roll-up advances."""

    last_price_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"price roll-up up to SpotPrice id {self.last_price_id}"
