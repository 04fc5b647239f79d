"""Input of the plan endpoint. Output is the planner's JSON (`Plan.to_dict`)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.common.fields import CharField
from controlplane.common.limits import MAX_ID
from runtime.config import FAULT_TOLERANT_STRATEGIES, MODEL_KINDS, ModelSpec
from runtime.planner.capacity_policy import CAPACITY_POLICIES


class ModelSpecSerializer(serializers.Serializer):
    """`runtime.config.ModelSpec`'s fields; what is left out takes ModelSpec's own default, and the
    spec is checked by ModelSpec itself (one owner of the names, defaults and rules)."""

    kind = serializers.ChoiceField(choices=MODEL_KINDS, required=False)
    n_layer = serializers.IntegerField(min_value=1, max_value=512)
    n_embd = serializers.IntegerField(min_value=1, max_value=65536)
    n_head = serializers.IntegerField(min_value=1, max_value=512, required=False)
    seq_len = serializers.IntegerField(min_value=1, max_value=131072, required=False)
    vocab_size = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False)
    in_features = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        problems = ModelSpec(**attrs).problems()
        if problems:
            raise serializers.ValidationError({p.field.removeprefix("model."): [p.message] for p in problems})
        return attrs

    def to_spec(self, attrs: dict[str, Any]) -> ModelSpec:
        return ModelSpec(**attrs)


class PlanRequestSerializer(serializers.Serializer):
    """A job to plan: either a model + batch + samples, or an existing job (its values are defaults)."""

    job = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_ID,
        help_text="Plan an existing job of your team.",
    )
    model = ModelSpecSerializer(required=False)
    global_batch = serializers.IntegerField(required=False, min_value=1, max_value=1_000_000)
    samples = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    deadline_hours = serializers.FloatField(required=False, min_value=0.001)
    budget_usd = serializers.FloatField(required=False, min_value=0.01)
    strategy = serializers.ChoiceField(choices=FAULT_TOLERANT_STRATEGIES, required=False)
    instance_types = serializers.ListField(child=CharField(max_length=60), min_length=1, max_length=40)
    zones = serializers.ListField(child=CharField(max_length=40), required=False, max_length=100)
    max_nodes = serializers.IntegerField(required=False, min_value=1, max_value=1024, default=32)
    microbatch_size = serializers.IntegerField(required=False, min_value=0, max_value=4096, default=0)
    capacity = serializers.ChoiceField(
        choices=CAPACITY_POLICIES, required=False,
        help_text="The capacity policy to estimate for (default: the job's, else spot): `estimate` in the answer.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "job" not in attrs:
            missing = [f for f in ("model", "global_batch", "samples") if f not in attrs]
            if missing:
                raise serializers.ValidationError({f: ["required when no job is given"] for f in missing})
        return attrs
