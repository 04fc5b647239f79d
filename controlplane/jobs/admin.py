"""Admin for training jobs and their generations, reconfigurations, metrics and events."""

from django.contrib import admin

from controlplane.jobs.models import JobEvent, JobGeneration, MetricSample, Reconfiguration, TrainingJob


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    fields = ["at", "kind", "message"]
    readonly_fields = fields
    ordering = ["-at"]
    show_change_link = True


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "status", "strategy", "steps_done", "target_steps", "deadline", "budget_usd",
                    "created_at"]
    list_filter = ["status", "strategy", "team"]
    search_fields = ["name"]
    list_select_related = ["team"]
    raw_id_fields = ["created_by"]
    readonly_fields = ["current_generation", "steps_done", "samples_done", "initial_loss", "last_loss",
                       "started_at", "finished_at", "created_at", "updated_at"]
    inlines = [JobEventInline]


@admin.register(JobGeneration)
class JobGenerationAdmin(admin.ModelAdmin):
    list_display = ["job", "number", "reason", "created_at"]
    list_select_related = ["job"]
    raw_id_fields = ["job"]


@admin.register(Reconfiguration)
class ReconfigurationAdmin(admin.ModelAdmin):
    list_display = ["job", "trigger", "decision", "status", "from_generation", "to_generation", "lost_seconds",
                    "decided_at"]
    list_filter = ["trigger", "status", "strategy"]
    list_select_related = ["job"]
    raw_id_fields = ["job", "instance", "notice"]


@admin.register(MetricSample)
class MetricSampleAdmin(admin.ModelAdmin):
    """Millions of rows: no count of the whole table, no filters that scan it."""

    list_display = ["job", "step", "generation", "loss", "samples_per_s", "at"]
    list_select_related = ["job"]
    raw_id_fields = ["job", "instance"]
    show_full_result_count = False


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["job", "kind", "message", "at"]
    list_filter = ["kind"]
    list_select_related = ["job"]
    raw_id_fields = ["job"]
