"""Query filters of `/instances/` and `/notices/`."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django_filters import rest_framework as filters

from controlplane.common.filters import BooleanFilter, OrderingFilter, char_filter, id_filter, search_filter
from controlplane.fleet.models import (
    Instance,
    InterruptionNotice,
    Lifecycle,
    NoticeKind,
    NoticeSource,
    NoticeStatus,
    ProviderKind,
)
from controlplane.fleet.states import InstanceState


class InstanceFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=InstanceState.choices)
    job = id_filter("job_id")
    provider = filters.ChoiceFilter(choices=ProviderKind.choices)
    lifecycle = filters.ChoiceFilter(choices=Lifecycle.choices)
    instance_type = char_filter("instance_type__name", max_length=60,
                                       help_text="Type name, e.g. p3.2xlarge.")
    zone = char_filter(method="filter_zone", max_length=40, help_text="Zone name (us-east-1a) or ID (use1-az4).")
    team = id_filter("team_id")
    search = search_filter("provider_instance_id")
    ordering = OrderingFilter("created_at", "state", "last_heartbeat_at", "running_at")

    class Meta:
        model = Instance
        fields: list[str] = []

    def filter_zone(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(Q(zone__code=value) | Q(zone__zone_id=value))


class NoticeFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=NoticeStatus.choices)
    source = filters.ChoiceFilter(choices=NoticeSource.choices)
    kind = filters.ChoiceFilter(choices=NoticeKind.choices)
    unknown_instance = BooleanFilter()
    instance = id_filter("instance_id")
    search = search_filter("provider_instance_id", "cloud_event_id")
    ordering = OrderingFilter("received_at", "event_time", "deadline")

    class Meta:
        model = InterruptionNotice
        fields: list[str] = []
