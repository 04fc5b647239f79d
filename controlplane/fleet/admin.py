"""Admin for instances, their events and interruption notices. Instance states change only
through `fleet.services.instance_transition`, so the state is read-only here."""

from django.contrib import admin

from controlplane.fleet.models import Instance, InstanceEvent, InterruptionNotice


class InstanceEventInline(admin.TabularInline):
    model = InstanceEvent
    extra = 0
    fields = ["at", "kind", "from_state", "to_state", "detail"]
    readonly_fields = fields
    can_delete = False


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "team", "job", "provider", "instance_type", "zone", "lifecycle", "state",
                    "last_heartbeat_at", "created_at"]
    list_filter = ["state", "provider", "lifecycle", "team"]
    search_fields = ["provider_instance_id"]
    list_select_related = ["team", "job", "instance_type", "zone"]
    raw_id_fields = ["job"]
    readonly_fields = ["state", "state_changed_at", "running_at", "notice_at", "ended_at", "last_heartbeat_at",
                       "request_token", "created_at", "updated_at"]
    inlines = [InstanceEventInline]


@admin.register(InterruptionNotice)
class InterruptionNoticeAdmin(admin.ModelAdmin):
    list_display = ["received_at", "source", "kind", "provider_instance_id", "instance", "unknown_instance",
                    "status", "attempts"]
    list_filter = ["status", "source", "kind", "unknown_instance"]
    search_fields = ["provider_instance_id", "cloud_event_id", "dedup_key"]
    list_select_related = ["instance"]
    raw_id_fields = ["instance"]
    readonly_fields = ["dedup_key", "received_at", "enqueued_at", "processed_at", "attempts", "payload"]
