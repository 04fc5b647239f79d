"""Serializers of the jobs API: read shapes, write inputs and query filters."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.api import JSONObjectField
from controlplane.common.fields import CharField, ModelSerializer
from controlplane.common.limits import MAX_COUNT, MAX_ID
from controlplane.jobs.admission import queue_positions
from controlplane.jobs.models import (
    DEFAULT_MAX_RESTARTS_ON_ERRORS,
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    EndReason,
    JobEvent,
    JobGeneration,
    JobStatus,
    MetricSample,
    Reconfiguration,
    Strategy,
    TrainingJob,
)
from controlplane.jobs.prepare_step import prepare_progress
from controlplane.jobs.services import MAX_METRIC_BATCH
from controlplane.jobs.spend import job_spend
from controlplane.jobs.tracking import TRACKERS
from controlplane.planning.plans import plan_view
from runtime.config import MAX_SAMPLES, model_spec_view


class SpendSerializer(serializers.Serializer):
    spent_usd = CharField(help_text="Metered from the billing segments at the price in force, to now.")
    usd_per_hour = CharField(help_text="The price per hour of the job's nodes running now.")
    projected_usd = CharField(allow_null=True, help_text="Spent plus the steps left at the measured step time "
                              "and today's rate; null before any step time is known.")
    budget_usd = CharField(allow_null=True)


class JobSerializer(ModelSerializer):
    created_by = CharField(source="created_by.username", read_only=True, allow_null=True, default=None)
    end_reason = CharField(read_only=True, help_text="Why the job ended (a stopping job: why it will): "
                           f"{', '.join(EndReason.values)}; \"\" while it has not ended.")
    model_spec = serializers.SerializerMethodField(
        help_text="Deprecated: the contract in the first API's names (layers, d_model, ...); read `config`."
    )
    live_instance_count = serializers.IntegerField(read_only=True, help_text="Instances requested or running.")
    progress = serializers.SerializerMethodField(help_text="steps_done / target_steps, 0..1.")
    plan = serializers.SerializerMethodField(
        help_text="Where the job's nodes come from (provider, pools, nodes, limits) and the planner's reasoning "
                  "(controlplane.planning.plans.JobPlan), with the contract's layout: dp, pp, microbatches, "
                  "strategy, schedule, min_stages (their one home is `config`).")

    class Meta:
        model = TrainingJob
        fields = [
            "id", "team", "name", "created_by", "config", "model_spec", "strategy", "target_steps", "deadline",
            "budget_usd", "capacity", "capacity_type", "deadline_unreachable_at", "status", "status_message", "plan",
            "priority", "max_runtime_s", "max_wait_s", "max_restarts_on_errors", "queued_at",
            "stop_requested_at", "end_reason", "exit_code", "end_log",
            "current_generation", "steps_done",
            "samples_done", "progress", "initial_loss", "last_loss", "last_val_loss", "live_instance_count",
            "created_at", "started_at", "finished_at",
        ]
        read_only_fields = fields


    def get_model_spec(self, job: TrainingJob) -> dict:
        return model_spec_view(job.config or {})

    @extend_schema_field(serializers.DictField())
    def get_plan(self, job: TrainingJob) -> dict:
        return plan_view(job.plan or {}, job.config or {})

    def get_progress(self, job: TrainingJob) -> float:
        return min(1.0, job.steps_done / job.target_steps) if job.target_steps else 0.0


class JobDetailSerializer(JobSerializer):
    """One job (its page, `GET /jobs/{id}/`, and the answers of submit, cancel and resume): the list's
    fields and its spend and queue place, which cost queries of their own per job."""

    spend = serializers.SerializerMethodField(help_text="Metered spend, the fleet's rate now, and the projection "
                                              "at completion (jobs.spend.job_spend).")
    queue_position = serializers.SerializerMethodField(
        help_text="A queued job's place in its team's queue (1: next admitted); null otherwise.")
    tracking = serializers.SerializerMethodField(
        help_text="The job's experiment tracker runs: name, run_id, run_name, where, last_step sent, ended, error.")
    prepare = serializers.SerializerMethodField(
        help_text="While the job prepares its data (config.data.prepare): {out, shares, done, running}; null "
                  "otherwise.")

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "spend", "queue_position", "tracking", "prepare"]
        read_only_fields = fields

    @extend_schema_field(SpendSerializer)
    def get_spend(self, job: TrainingJob) -> dict:
        spend = job_spend(job=job, at=timezone.now())
        return {"spent_usd": f"{spend.spent_usd:.2f}", "usd_per_hour": f"{spend.usd_per_hour:.4f}",
                "projected_usd": None if spend.projected_usd is None else f"{spend.projected_usd:.2f}",
                "budget_usd": None if job.budget_usd is None else str(job.budget_usd)}

    def get_queue_position(self, job: TrainingJob) -> int | None:
        if job.status != JobStatus.QUEUED:
            return None
        return queue_positions(team_id=job.team_id).get(job.pk)

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_prepare(self, job: TrainingJob) -> dict | None:
        return prepare_progress(job)

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_tracking(self, job: TrainingJob) -> list[dict]:
        return list(job.trackers.order_by("name").values("name", "run_id", "run_name", "where", "last_step", "ended",
                                                         "error"))


class ResumedFromSerializer(serializers.Serializer):
    step = serializers.IntegerField(help_text="The step the job continues from (0: from the start).")
    checkpoint = serializers.BooleanField(help_text="Whether that step is a complete checkpoint of the job's.")
    message = CharField()


class JobResumedSerializer(JobDetailSerializer):
    """`POST /jobs/{id}/resume/`'s answer: the job and where it continues from."""

    resumed_from = ResumedFromSerializer(read_only=True)

    class Meta(JobDetailSerializer.Meta):
        fields = [*JobDetailSerializer.Meta.fields, "resumed_from"]
        read_only_fields = fields


class JobSubmitSerializer(serializers.Serializer):
    """Input of `POST /jobs/`. The contract and the plan are checked in depth by `job_submit`, which
    builds the runtime's JobConfig (docs/api.md, "The job contract")."""

    team = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_ID,
        help_text="Needed if you belong to several teams.",
    )
    name = CharField(max_length=120)
    config = JSONObjectField(
        required=False,
        help_text="The runtime's JobConfig fields but the layout: {model: {kind, and its kind's fields: gpt n_layer, "
        "n_embd, n_head, seq_len, vocab_size; mlp n_layer, n_embd, in_features, vocab_size; py path, args, loss, "
        "layers, seq_len, vocab_size, language_model}, global_batch, seed, lr, weight_decay, schedule, "
        "device_time, ...}",
    )
    model_spec = JSONObjectField(
        required=False,
        help_text="Deprecated alias of config: {kind: gpt|mlp, layers, d_model, heads, seq_len, vocab, global_batch, "
        "micro_batches (per step)}",
    )
    plan = serializers.JSONField(
        required=False, default=None, allow_null=True,
        help_text='"auto" (the planner chooses for the deadline or budget), or {dp, pp, nodes, microbatches, provider, '
        "instance_types, zones}; omitted: one node",
    )
    strategy = serializers.ChoiceField(choices=Strategy.choices, default=Strategy.AUTO)
    target_steps = serializers.IntegerField(min_value=1, max_value=2**31 - 1)
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    budget_usd = serializers.DecimalField(
        max_digits=12, decimal_places=2, required=False, allow_null=True, default=None, min_value=Decimal("0.01")
    )
    capacity = CharField(
        required=False, allow_null=True, default=None, max_length=40,
        help_text="spot (default), spot_then_on_demand (on-demand when the deadline needs it) or on_demand",
    )
    priority = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=0,
                                        max_value=MAX_PRIORITY, help_text=f"Queue order, higher first (default "
                                        f"{DEFAULT_PRIORITY}).")
    max_runtime_s = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                             max_value=2**31 - 1, help_text="Stop (checkpoint first) after this "
                                             "many seconds of training.")
    max_wait_s = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                          max_value=2**31 - 1, help_text="Stop after this many seconds in a row "
                                          "without enough capacity.")
    max_restarts_on_errors = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=2**31 - 1,
        help_text=f"Worker crashes survived (default {DEFAULT_MAX_RESTARTS_ON_ERRORS}); the next fails the job "
        "with end_reason user_error.")


    allow_over_budget = serializers.BooleanField(
        required=False, default=False, help_text="Submit an explicit plan estimated above budget_usd anyway (the "
        "job stops at its budget); otherwise 422.")
    tracking = serializers.ListField(
        child=CharField(max_length=40), required=False, default=list, max_length=len(TRACKERS),
        help_text=f"Experiment trackers the control plane forwards the job's metrics to: some of {list(TRACKERS)}, "
        "each configured in the control plane's environment (docs/api.md, \"Experiment trackers\").")


class JobResumeSerializer(serializers.Serializer):
    """Optional body of `POST /jobs/{id}/resume/`."""

    budget_usd = serializers.DecimalField(
        max_digits=12, decimal_places=2, required=False, allow_null=True, default=None, min_value=Decimal("0.01"),
        help_text="The job's new total budget (above what it has spent); needed after a budget stop.")


class JobGenerationSerializer(ModelSerializer):
    class Meta:
        model = JobGeneration
        fields = ["number", "membership", "layout", "reason", "created_at"]
        read_only_fields = fields


class ReconfigurationSerializer(ModelSerializer):
    provider_instance_id = CharField(
        source="instance.provider_instance_id", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = Reconfiguration
        fields = [
            "id", "trigger", "trigger_key", "strategy", "decision", "decision_input", "instance",
            "provider_instance_id", "notice", "from_generation", "to_generation", "status",
            "lost_seconds", "decided_at", "applied_at",
        ]
        read_only_fields = fields


class JobEventSerializer(ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["id", "kind", "message", "data", "at"]
        read_only_fields = fields


class MetricSampleSerializer(ModelSerializer):
    class Meta:
        model = MetricSample
        fields = ["step", "generation", "instance", "at", "loss", "val_loss", "samples_per_s", "stage_times"]
        read_only_fields = fields


class MetricSampleInSerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, max_value=2**31 - 1)
    loss = serializers.FloatField(required=False, allow_null=True)
    val_loss = serializers.FloatField(
        required=False, allow_null=True,
        help_text="Validation loss (a validation pass's sample, usually without `loss`).",
    )
    samples_per_s = serializers.FloatField(required=False, allow_null=True, min_value=0)
    at = serializers.DateTimeField(required=False, help_text="Defaults to the time of the request.")
    generation = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_COUNT,
        help_text="Defaults to the job's current one.",
    )
    stage_times = serializers.DictField(child=serializers.FloatField(min_value=0), required=False,
                                        help_text="{stage: seconds} of this step.")
    instance = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_ID,
                                        help_text="Defaults to the reporting agent's instance.")


class MetricBatchSerializer(serializers.Serializer):
    """Input of `POST /jobs/{id}/metrics/`: `{"samples": [...]}` (a bare list is accepted too), of
    the job in `context["job"]`."""

    samples = MetricSampleInSerializer(many=True, allow_empty=False, max_length=MAX_METRIC_BATCH)

    def validate_samples(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A job stored before runtime.config bounded global_batch could count more samples than the
        # 64-bit samples_done holds: the step is refused, not a database error the agent retries forever.
        job = self.context.get("job")
        batch = (job.config or {}).get("global_batch") if job is not None else None
        if not isinstance(batch, int) or batch < 1:
            return samples
        errors = [{"step": [f"step {s['step']} x global_batch {batch} samples is more than the {MAX_SAMPLES} a "
                            "job can count"]} if s["step"] * batch > MAX_SAMPLES else {} for s in samples]
        if any(errors):
            raise serializers.ValidationError(errors)
        return samples


class MetricBatchResultSerializer(serializers.Serializer):
    stored = serializers.IntegerField(help_text=(
        "Samples stored by this request; a sample stored before (the same job, generation, instance, step "
        "and kind: a batch sent again) is not stored twice and not counted."))
    steps_done = serializers.IntegerField()
    samples_done = serializers.IntegerField()
    last_loss = serializers.FloatField(allow_null=True)
    last_val_loss = serializers.FloatField(allow_null=True)


class ArtifactSerializer(serializers.Serializer):
    name = CharField(help_text="File name in the job's folder (model.safetensors, spotpipe.json, ...).")
    size = serializers.IntegerField(help_text="Bytes.")
    sha256 = CharField(help_text="Hex digest of the file's bytes.")
    url = CharField(help_text="Where to download it (GET, same token).")


class ArtifactListSerializer(serializers.Serializer):
    location = CharField(help_text="The job's folder in the artifact store (SPOTPIPE_ARTIFACTS).")
    complete = serializers.BooleanField(
        help_text="The export is whole (its index is in place); files is empty until then."
    )
    files = ArtifactSerializer(many=True)
    load_snippet = CharField(help_text="Python lines that load the weights with spotpipe.load_model.")


