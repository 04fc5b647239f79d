"""The spot market: clouds, regions, zones, instance types and spot price history."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TimeStampedModel


class Cloud(models.Model):
    """A provider of capacity: aws, gcp, azure, or local (processes on this host)."""

    code = models.SlugField(max_length=20, unique=True)
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.code


class Region(models.Model):
    cloud = models.ForeignKey(Cloud, on_delete=models.CASCADE, related_name="regions")
    code = models.CharField(max_length=40)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cloud", "code"], name="region_cloud_code_unique")]

    def __str__(self) -> str:
        return f"{self.cloud.code}:{self.code}"


class Zone(models.Model):
    """An availability zone. AWS names zones per account (`us-east-1a`) but IDs them globally
    (`use1-az4`); price history uses the ID, so both are kept."""

    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="zones")
    code = models.CharField(max_length=40, help_text="Zone name or, when only the ID is known, the ID.")
    zone_id = models.CharField(max_length=40, null=True, blank=True, unique=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["region", "code"], name="zone_region_code_unique")]

    def __str__(self) -> str:
        return self.code


class InstanceType(TimeStampedModel):
    """A VM shape with its on-demand reference price (USD per hour)."""

    cloud = models.ForeignKey(Cloud, on_delete=models.CASCADE, related_name="instance_types")
    name = models.CharField(max_length=60)
    vcpus = models.PositiveIntegerField(default=0)
    memory_gib = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    accelerator_name = models.CharField(max_length=40, blank=True)
    accelerator_count = models.PositiveIntegerField(default=0)
    accelerator_memory_gib = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    network_gbps = models.DecimalField(max_digits=8, decimal_places=2, default=0)
    on_demand_price = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, help_text="USD per hour; null when unknown."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cloud", "name"], name="instancetype_cloud_name_unique")
        ]

    def __str__(self) -> str:
        return self.name


class SpotPrice(models.Model):
    """One price change of a spot pool (instance type x zone x product), as the cloud reports it.

    Unique per (type, zone, product, timestamp), so loading the same history twice adds nothing.
    The unique index also serves "price in force at time t" and history-of-a-pool queries.
    """

    instance_type = models.ForeignKey(InstanceType, on_delete=models.CASCADE, related_name="spot_prices")
    zone = models.ForeignKey(Zone, on_delete=models.CASCADE, related_name="spot_prices")
    product = models.CharField(max_length=40, default="Linux/UNIX")
    price = models.DecimalField(max_digits=12, decimal_places=6, help_text="USD per hour")
    timestamp = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["instance_type", "zone", "product", "timestamp"], name="spotprice_pool_time_unique"
            )
        ]
        indexes = [models.Index(fields=["timestamp"], name="spotprice_timestamp_idx")]

    def __str__(self) -> str:
        return f"{self.instance_type_id}@{self.zone_id} {self.price} at {self.timestamp:%Y-%m-%d %H:%M}"


class SpotPool(models.Model):
    """One spot pool (instance type x zone x product) with its newest known price.

    Maintained by the price loader (an upsert per batch), so "which pools exist" and "what is the
    latest price" never need a scan of the price history, which grows to millions of rows. The
    price in force at a past moment is still read from SpotPrice through its unique index."""

    instance_type = models.ForeignKey(InstanceType, on_delete=models.CASCADE, related_name="spot_pools")
    zone = models.ForeignKey(Zone, on_delete=models.CASCADE, related_name="spot_pools")
    product = models.CharField(max_length=40, default="Linux/UNIX")
    latest_timestamp = models.DateTimeField()
    latest_price = models.DecimalField(max_digits=12, decimal_places=6, help_text="USD per hour")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["instance_type", "zone", "product"], name="spotpool_unique")
        ]
        indexes = [models.Index(fields=["product", "latest_price"], name="spotpool_product_price_idx")]

    def __str__(self) -> str:
        return f"{self.instance_type_id}@{self.zone_id} {self.product}: {self.latest_price}"


# --- the hourly price roll-up (a cache of SpotPrice for long-range charts; see market/rollup.py) ---


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
                fields=["instance_type", "zone", "product", "hour_index"], name="market_pricehour_pool_hour_unique"
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
