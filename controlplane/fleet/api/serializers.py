"""Serializers of the fleet API."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.common.fields import CharField, ModelSerializer
from controlplane.fleet.models import (
    Instance,
    InstanceEvent,
    InterruptionNotice,
)
from controlplane.fleet.states import InstanceState


class InstanceSerializer(ModelSerializer):
    instance_type = CharField(source="instance_type.name", read_only=True)
    cloud = CharField(source="instance_type.cloud.code", read_only=True)
    zone = CharField(source="zone.code", read_only=True, allow_null=True, default=None)
    region = CharField(source="zone.region.code", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Instance
        fields = [
            "id", "team", "job", "provider", "provider_instance_id", "cloud", "instance_type", "region", "zone",
            "lifecycle", "state", "state_changed_at", "running_at", "notice_at", "ended_at",
            "last_heartbeat_at", "agent_address", "created_at",
        ]
        read_only_fields = fields


class InstanceEventSerializer(ModelSerializer):
    class Meta:
        model = InstanceEvent
        fields = ["id", "kind", "from_state", "to_state", "at", "detail"]
        read_only_fields = fields


class NoticeSerializer(ModelSerializer):
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

    agent_address = CharField(max_length=200, required=False, allow_blank=True,
                                          help_text="host:port where the control plane can reach the agent.")


class HeartbeatResultSerializer(serializers.Serializer):
    """What the agent needs back: its state, its job and the job's current generation, so it knows
    when to fetch a new membership and layout."""

    instance = serializers.IntegerField()
    state = serializers.ChoiceField(choices=InstanceState.choices)
    last_heartbeat_at = serializers.DateTimeField()
    job = serializers.IntegerField(allow_null=True)
    job_status = CharField(allow_null=True)
    current_generation = serializers.IntegerField(allow_null=True)
