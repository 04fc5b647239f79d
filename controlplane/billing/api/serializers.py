"""Serializers of the billing API."""

from __future__ import annotations

from datetime import date

from rest_framework import serializers

from controlplane.billing.models import BillingSegment
from controlplane.billing.reports import spend_window_problem
from controlplane.common.fields import CharField, ModelSerializer


class BillingSegmentSerializer(ModelSerializer):
    instance_type = CharField(source="instance.instance_type.name", read_only=True)
    zone = serializers.SerializerMethodField()

    class Meta:
        model = BillingSegment
        fields = ["id", "instance", "job", "team", "instance_type", "zone", "start", "end", "price_per_hour",
                  "on_demand_price_per_hour", "price_source"]

    def get_zone(self, obj: BillingSegment) -> str | None:
        zone = obj.instance.zone
        return (zone.zone_id or zone.code) if zone else None


class CostReportQuery(serializers.Serializer):
    as_of = serializers.DateTimeField(required=False, help_text="Open segments are costed until this moment.")


class _CostLineSerializer(serializers.Serializer):
    """What every cost figure carries: hours billed, their spot cost and the on-demand equivalent."""

    hours = serializers.DecimalField(max_digits=14, decimal_places=4)
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=2)
    on_demand_cost_usd = serializers.DecimalField(max_digits=14, decimal_places=2)


class _BreakdownSerializer(_CostLineSerializer):
    segments = serializers.IntegerField()


class TypeBreakdownSerializer(_BreakdownSerializer):
    instance_type = CharField()


class ZoneBreakdownSerializer(_BreakdownSerializer):
    zone = CharField()


class CapacityLineSerializer(serializers.Serializer):
    """Hours and cost of the segments of one capacity type."""

    segments = serializers.IntegerField()
    hours = serializers.DecimalField(max_digits=14, decimal_places=4)
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=2)


class CapacityTypeSplitSerializer(serializers.Serializer):
    """Both capacity types, always present (0 when unused); they add up to the report's totals."""

    spot = CapacityLineSerializer(help_text="Instances bought as spot.")
    on_demand = CapacityLineSerializer(help_text="Instances bought on demand (priced at the type's on-demand price).")


class SegmentCostSerializer(serializers.Serializer):
    segment_id = serializers.IntegerField()
    instance_id = serializers.IntegerField()
    provider_instance_id = CharField()
    instance_type = CharField()
    zone = CharField()
    lifecycle = CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(allow_null=True)
    hours = serializers.DecimalField(max_digits=14, decimal_places=4)
    price_per_hour = serializers.DecimalField(max_digits=12, decimal_places=6)
    price_source = CharField()
    cost_usd = serializers.DecimalField(max_digits=16, decimal_places=6)
    on_demand_cost_usd = serializers.DecimalField(max_digits=16, decimal_places=6)


class _CostTotalsSerializer(serializers.Serializer):
    """The totals a job's cost report and a team's spend report both carry."""

    as_of = serializers.DateTimeField()
    currency = CharField()
    total_usd = serializers.DecimalField(max_digits=14, decimal_places=2)
    billed_hours = serializers.DecimalField(max_digits=14, decimal_places=4)
    on_demand_equivalent_usd = serializers.DecimalField(max_digits=14, decimal_places=2)
    savings_usd = serializers.DecimalField(max_digits=14, decimal_places=2)


class CostReportSerializer(_CostTotalsSerializer):
    """Schema of `CostReport.to_dict()` (amounts as decimal strings)."""

    job = serializers.IntegerField()
    job_name = CharField()
    savings_pct = serializers.DecimalField(max_digits=6, decimal_places=2, allow_null=True)
    preemption_events = serializers.IntegerField()
    preemption_lost_seconds = serializers.FloatField()
    preemption_loss_usd = serializers.DecimalField(
        max_digits=14, decimal_places=2,
        help_text="Sum of lost_seconds/3600 x the job's spend rate (USD/h) at each reconfiguration.",
    )
    by_instance_type = TypeBreakdownSerializer(many=True)
    by_zone = ZoneBreakdownSerializer(many=True)
    by_capacity_type = CapacityTypeSplitSerializer(
        help_text="Spot and on-demand hours and cost apart (Instance.lifecycle of each segment's instance)."
    )
    segments = SegmentCostSerializer(many=True)


class SpendReportQuery(serializers.Serializer):
    """Window of `GET /teams/{id}/spend/`: UTC days, both ends included."""

    start = serializers.DateField(required=False, help_text="First UTC day (default: 29 days before `end`).")
    end = serializers.DateField(required=False, help_text="Last UTC day, included (default: today).")

    def validate(self, attrs: dict) -> dict:
        from django.utils import timezone

        end = attrs.get("end") or timezone.now().date()
        # 29 days before `end`, or the first date there is (`end - 29 days` overflows before it).
        start = attrs.get("start") or date.fromordinal(max(end.toordinal() - 29, 1))
        problem = spend_window_problem(start, end)
        if problem:
            raise serializers.ValidationError({"end": [problem]})
        return {"start": start, "end": end}


class SpendDaySerializer(_CostLineSerializer):
    day = serializers.DateField()


class SpendJobSerializer(_CostLineSerializer):
    job = serializers.IntegerField(allow_null=True, help_text="null: instances bought for no job.")
    job_name = CharField()


class TeamSpendReportSerializer(_CostTotalsSerializer):
    """Schema of `TeamSpendReport.to_dict()` (amounts as decimal strings)."""

    team = serializers.IntegerField()
    team_slug = CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(help_text="Exclusive: midnight UTC after the last day.")
    by_day = SpendDaySerializer(many=True)
    by_job = SpendJobSerializer(many=True, help_text="Costliest first.")
