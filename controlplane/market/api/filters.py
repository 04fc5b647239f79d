"""Query filters of `/instance-types/` and `/zones/`."""

from __future__ import annotations

from django.db.models import QuerySet
from django_filters import rest_framework as filters

from controlplane.common.filters import BooleanFilter, char_filter
from controlplane.market.models import InstanceType, Zone


class InstanceTypeFilter(filters.FilterSet):
    cloud = char_filter("cloud__code", max_length=20, help_text="Cloud code, e.g. aws or local.")
    accelerated = BooleanFilter(method="filter_accelerated",
                                help_text="Only types with (true) or without (false) GPUs.")

    class Meta:
        model = InstanceType
        fields: list[str] = []

    def filter_accelerated(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        return queryset.filter(accelerator_count__gt=0) if value else queryset.filter(accelerator_count=0)


class ZoneFilter(filters.FilterSet):
    cloud = char_filter("region__cloud__code", max_length=20)
    region = char_filter("region__code", max_length=40, help_text="Region code, e.g. us-east-1.")

    class Meta:
        model = Zone
        fields: list[str] = []
