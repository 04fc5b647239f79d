"""Query filters of `/billing/segments/`."""

from __future__ import annotations

from django_filters import rest_framework as filters

from controlplane.billing.models import BillingSegment
from controlplane.common.filters import id_filter


class SegmentFilter(filters.FilterSet):
    job = id_filter("job_id", help_text="Only this job's segments.")
    instance = id_filter("instance_id", help_text="Only this instance's segments.")

    class Meta:
        model = BillingSegment
        fields: list[str] = []
