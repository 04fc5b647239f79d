"""Query filters of the job lists: `/jobs/`, and a job's `/metrics/` and `/events/`."""

from __future__ import annotations

from django_filters import rest_framework as filters

from controlplane.common.filters import (
    OrderingFilter,
    UtcDateTimeFilter,
    char_filter,
    id_filter,
    integer_filter,
    search_filter,
)
from controlplane.common.limits import MAX_COUNT
from controlplane.jobs.models import JobEvent, JobStatus, MetricSample, Strategy, TrainingJob


class JobFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=JobStatus.choices)
    strategy = filters.ChoiceFilter(choices=Strategy.choices)
    team = id_filter("team_id")
    search = search_filter("name")
    ordering = OrderingFilter("created_at", "name", "status", "deadline", "steps_done")

    class Meta:
        model = TrainingJob
        fields: list[str] = []


class MetricFilter(filters.FilterSet):
    since_step = integer_filter("step", lookup_expr="gte", max_value=MAX_COUNT, help_text="Samples with step >= this.")
    until_step = integer_filter("step", lookup_expr="lte", max_value=MAX_COUNT, help_text="Samples with step <= this.")
    generation = integer_filter("generation", max_value=MAX_COUNT)
    instance = id_filter("instance_id")

    class Meta:
        model = MetricSample
        fields: list[str] = []


class JobEventFilter(filters.FilterSet):
    kind = char_filter("kind", max_length=40)
    since = UtcDateTimeFilter(field_name="at", lookup_expr="gte", help_text="Events at or after this time.")

    class Meta:
        model = JobEvent
        fields: list[str] = []
