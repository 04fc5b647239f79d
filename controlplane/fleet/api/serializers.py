"""Serializers of the fleet API."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from rest_framework import serializers

from controlplane.common.api import QueryFilterSerializer
from controlplane.common.limits import MAX_ID
from controlplane.fleet.models import (
    Instance,
    InstanceEvent,
    InterruptionNotice,
    Lifecycle,
    NoticeKind,
    NoticeSource,
    NoticeStatus,
    ProviderKind,
)
from controlplane.fleet.states import InstanceState


class InstanceSerializer(serializers.ModelSerializer):
    instance_type = serializers.CharField(source="instance_type.name", read_only=True)
    cloud = serializers.CharField(source="instance_type.cloud.code", read_only=True)
    zone = serializers.CharField(source="zone.code", read_only=True, allow_null=True, default=None)
    region = serializers.CharField(source="zone.region.code", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Instance
        fields = [
            "id", "team", "job", "provider", "provider_instance_id", "cloud", "instance_type", "region", "zone",
            "lifecycle", "state", "state_changed_at", "running_at", "notice_at", "ended_at",
            "last_heartbeat_at", "agent_address", "created_at",
        ]
        read_only_fields = fields


class InstanceEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = InstanceEvent
        fields = ["id", "kind", "from_state", "to_state", "at", "detail"]
        read_only_fields = fields


class NoticeSerializer(serializers.ModelSerializer):
    class Meta:
        model = InterruptionNotice
        fields = [
            "id", "team", "source", "kind", "action", "cloud_event_id", "provider_instance_id", "instance",
            "unknown_instance", "event_time", "deadline", "received_at", "status", "enqueued_at",
            "processed_at", "attempts", "error", "payload",
        ]
        read_only_fields = fields


class HeartbeatSerializer(serializers.Serializer):
    """Input of `POST /instances/{id}/heartbeat/` (the body may be empty)."""

    agent_address = serializers.CharField(max_length=200, required=False, allow_blank=True,
                                          help_text="host:port where the control plane can reach the agent.")


class HeartbeatResultSerializer(serializers.Serializer):
    """What the agent needs back: its state, its job and the job's current generation, so it knows
    when to fetch a new membership and layout."""

    instance = serializers.IntegerField()
    state = serializers.ChoiceField(choices=InstanceState.choices)
    last_heartbeat_at = serializers.DateTimeField()
    job = serializers.IntegerField(allow_null=True)
    job_status = serializers.CharField(allow_null=True)
    current_generation = serializers.IntegerField(allow_null=True)


class InstanceFilter(QueryFilterSerializer):
    state = serializers.ChoiceField(choices=InstanceState.choices, required=False)
    job = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    provider = serializers.ChoiceField(choices=ProviderKind.choices, required=False)
    lifecycle = serializers.ChoiceField(choices=Lifecycle.choices, required=False)
    instance_type = serializers.CharField(required=False, max_length=60, help_text="Type name, e.g. p3.2xlarge.")
    zone = serializers.CharField(required=False, max_length=40, help_text="Zone name (us-east-1a) or ID (use1-az4).")
    team = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    lookups = {"job": "job_id", "team": "team_id", "instance_type": "instance_type__name"}
    search_fields = ("provider_instance_id",)
    ordering_fields = ("created_at", "state", "last_heartbeat_at", "running_at")

    def filter_zone(self, queryset: QuerySet, value: str) -> QuerySet:
        return queryset.filter(Q(zone__code=value) | Q(zone__zone_id=value))


class NoticeFilter(QueryFilterSerializer):
    status = serializers.ChoiceField(choices=NoticeStatus.choices, required=False)
    source = serializers.ChoiceField(choices=NoticeSource.choices, required=False)
    kind = serializers.ChoiceField(choices=NoticeKind.choices, required=False)
    unknown_instance = serializers.BooleanField(required=False)
    instance = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    lookups = {"instance": "instance_id"}
    search_fields = ("provider_instance_id", "cloud_event_id")
    ordering_fields = ("received_at", "event_time", "deadline")


class TerminateSerializer(serializers.Serializer):
    """Input of `POST /instances/{id}/terminate/`."""

    reason = serializers.CharField(max_length=200, required=False, allow_blank=True,
                                   help_text="Recorded on the instance's and the job's events.")
