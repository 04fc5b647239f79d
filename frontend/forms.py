"""The job submission form. Validation of the job itself stays in `jobs.services.job_submit`; the
form only parses browser input (numbers, a datetime-local field) into the job contract and the plan,
and shows the service's errors next to the fields they name. Field names are the contract's
(`runtime/config.py`), so `config.model.n_head`, `config.data.source` or `plan.dp` lands on the
`n_head`, `source` or `dp` field."""

from __future__ import annotations

import dataclasses
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from controlplane.accounts.models import Team
from controlplane.jobs.models import Strategy
from runtime.config import MODEL_KINDS, DataSpec, JobConfig

MODEL_FIELDS = ("n_layer", "n_embd", "n_head", "seq_len", "vocab_size")
GPT_ONLY = ("n_head", "seq_len", "vocab_size")
DATA_FIELDS = ("source", "tokenizer", "val_every")
# The runtime's defaults (runtime/config.py owns them): the byte tokenizer, no validation.
DEFAULT_TOKENIZER = DataSpec().tokenizer
DEFAULT_VAL_EVERY = {f.name: f.default for f in dataclasses.fields(JobConfig)}["val_every"]
PLAN_CHOICES = [("auto", "Let the planner choose (cheapest that meets the deadline, or fastest within the budget)"),
                ("manual", "I choose the layout")]


class JobSubmitForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.CharField(max_length=120)
    strategy = forms.ChoiceField(choices=Strategy.choices, initial=Strategy.AUTO)
    target_steps = forms.IntegerField(min_value=1, initial=1000, label="Target steps")
    kind = forms.ChoiceField(choices=[(k, k.upper()) for k in MODEL_KINDS], initial="gpt", label="Model kind")
    n_layer = forms.IntegerField(min_value=1, initial=8, label="Layers (blocks)")
    n_embd = forms.IntegerField(min_value=1, initial=256, label="Model width")
    n_head = forms.IntegerField(min_value=1, initial=8, required=False, label="Attention heads")
    seq_len = forms.IntegerField(min_value=1, initial=128, required=False, label="Sequence length")
    vocab_size = forms.IntegerField(min_value=1, initial=1024, required=False, label="Vocabulary")
    global_batch = forms.IntegerField(min_value=1, initial=64, label="Global batch (samples per step)")
    source = forms.CharField(
        required=False, max_length=1000, label="Data source (FORMAT:LOCATION)",
        widget=forms.TextInput(attrs={"placeholder": "text:s3://bucket/corpus/ (empty: synthetic tokens)"}),
        help_text="tokens:, text:, jsonl:PATH?field=NAME, hf: or py:module:function; a path on the nodes, "
                  "a glob or an s3:// URI",
    )
    tokenizer = forms.CharField(required=False, max_length=1000, initial=DEFAULT_TOKENIZER, label="Tokenizer",
                                help_text="byte (built in, 256 ids), or the path or s3:// URI of a tokenizer.json")
    val_every = forms.IntegerField(min_value=0, required=False, initial=DEFAULT_VAL_EVERY,
                                   label="Validate every (steps, 0: never)")
    plan_mode = forms.ChoiceField(choices=PLAN_CHOICES, initial="auto", widget=forms.RadioSelect, label="Plan")
    dp = forms.IntegerField(min_value=1, required=False, label="Data-parallel pipelines (dp)")
    pp = forms.IntegerField(min_value=1, required=False, label="Pipeline stages (pp)")
    microbatches = forms.IntegerField(min_value=1, required=False, label="Micro-batches per pipeline")
    deadline = forms.DateTimeField(required=False, label="Deadline (UTC)",
                                   widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                   input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"])
    budget_usd = forms.DecimalField(required=False, min_value=0, decimal_places=2, max_digits=12,
                                    label="Budget (USD)")

    FIELDSETS = (
        ("Job", ("team", "name", "strategy", "target_steps")),
        ("Model", ("kind", *MODEL_FIELDS, "global_batch")),
        ("Data", DATA_FIELDS),
        ("Plan", ("plan_mode", "dp", "pp", "microbatches")),
        ("Deadline or budget (at least one)", ("deadline", "budget_usd")),
    )

    def __init__(self, *args: Any, teams: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams

    def fieldsets(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [(legend, [self[name] for name in names]) for legend, names in self.FIELDSETS]

    def config(self) -> dict[str, Any]:
        """The job contract (the runtime's JobConfig fields but the layout)."""
        data = self.cleaned_data
        model: dict[str, Any] = {"kind": data["kind"]}
        for name in MODEL_FIELDS:
            if data.get(name) is not None and (data["kind"] == "gpt" or name not in GPT_ONLY):
                model[name] = data[name]
        config: dict[str, Any] = {"model": model, "global_batch": data["global_batch"]}
        source, tokenizer = data.get("source") or "", data.get("tokenizer") or ""
        if source or tokenizer not in ("", DEFAULT_TOKENIZER):
            config["data"] = {"source": source, **({"tokenizer": tokenizer} if tokenizer else {})}
        if data.get("val_every") is not None:
            config["val_every"] = data["val_every"]
        return config

    def plan(self) -> dict[str, Any] | str:
        data = self.cleaned_data
        if data["plan_mode"] == "auto":
            return "auto"
        return {name: data[name] for name in ("dp", "pp", "microbatches") if data.get(name) is not None}

    def add_service_errors(self, error: ValidationError) -> None:
        """Attach `job_submit`'s errors (keyed `config.model.n_head`, `plan.dp`, `deadline`, ...) to fields."""
        for key, messages in error.message_dict.items():
            name = key.rsplit(".", 1)[-1]
            target = name if name in self.fields else None
            for message in messages:
                self.add_error(target, message if target else f"{key}: {message}")
