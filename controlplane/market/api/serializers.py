"""Serializers of the market API: catalogue rows, query parameters (validated, 400 naming the
parameter) and price points."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.common.fields import CharField, ModelSerializer
from controlplane.market.models import InstanceType, Zone
from controlplane.market.selectors import LINUX

MAX_BUCKET_SECONDS = 366 * 86400


class InstanceTypeSerializer(ModelSerializer):
    cloud = CharField(source="cloud.code", read_only=True)

    class Meta:
        model = InstanceType
        fields = ["id", "cloud", "name", "vcpus", "memory_gib", "accelerator_name", "accelerator_count",
                  "accelerator_memory_gib", "network_gbps", "on_demand_price"]


class ZoneSerializer(ModelSerializer):
    region = CharField(source="region.code", read_only=True)
    cloud = CharField(source="region.cloud.code", read_only=True)

    class Meta:
        model = Zone
        fields = ["id", "cloud", "region", "code", "zone_id"]


class SpotPriceQuery(serializers.Serializer):
    """Query parameters of /spot-prices/."""

    instance_type = CharField(max_length=60, help_text="Instance type name, e.g. p3.2xlarge.")
    zone = CharField(max_length=40, help_text="Zone ID (use1-az4) or zone name (us-east-1a).")
    product = CharField(max_length=40, required=False, default=LINUX)
    start = serializers.DateTimeField(required=False, help_text="ISO 8601; inclusive.")
    end = serializers.DateTimeField(required=False, help_text="ISO 8601; exclusive.")
    bucket = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_BUCKET_SECONDS,
        help_text="Downsample into buckets of this many seconds (aligned on the Unix epoch).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start, end = attrs.get("start"), attrs.get("end")
        if start and end and end <= start:
            raise serializers.ValidationError({"end": ["must be after start"]})
        return attrs


class PricePointSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    price = serializers.DecimalField(max_digits=12, decimal_places=6, help_text="Price, or mean of the bucket.")
    min = serializers.DecimalField(max_digits=12, decimal_places=6)
    max = serializers.DecimalField(max_digits=12, decimal_places=6)
    count = serializers.IntegerField(help_text="Price changes in the bucket (1 without bucketing).")


class SpotPriceHistorySerializer(serializers.Serializer):
    instance_type = CharField()
    zone = CharField()
    product = CharField()
    bucket_seconds = serializers.IntegerField(allow_null=True)
    points = PricePointSerializer(many=True)


class CheapestQuery(serializers.Serializer):
    """Query parameters of /spot-prices/cheapest/."""

    at = serializers.DateTimeField(required=False, help_text="Moment of the prices (default: now).")
    instance_type = CharField(
        required=False, max_length=2000, help_text="Comma-separated instance type names to consider."
    )
    product = CharField(max_length=40, required=False, default=LINUX)
    limit = serializers.IntegerField(required=False, default=10, min_value=1, max_value=500)
    per_accelerator = serializers.BooleanField(
        required=False, default=False, help_text="Order by price per accelerator (GPU types only)."
    )

    def validate_instance_type(self, value: str) -> list[str]:
        names = [n.strip() for n in value.split(",") if n.strip()]
        if not names:
            raise serializers.ValidationError("name at least one instance type")
        return names


class PoolSerializer(serializers.Serializer):
    instance_type = CharField()
    zone = CharField()
    zone_aws_id = CharField(allow_null=True)
    region = CharField()
    price = serializers.DecimalField(max_digits=12, decimal_places=6)
    since = serializers.DateTimeField(help_text="When this price came into force.")
    on_demand_price = serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True)
    savings_pct = serializers.DecimalField(max_digits=6, decimal_places=2, allow_null=True)
    accelerator_name = CharField()
    accelerator_count = serializers.IntegerField()
