"""The job submission form. Validation of the job itself stays in `jobs.services.job_submit`; the
form only parses browser input (numbers, a datetime-local field) into the job contract and the plan,
and shows the service's errors next to the fields they name. Field names are the contract's
(`runtime/config.py`), so `config.model.n_head`, `config.data.source` or `plan.dp` lands on the
`n_head`, `source` or `dp` field."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from controlplane.accounts.models import Team
from controlplane.jobs.models import Strategy
from runtime.config import (
    DEVICES,
    LR_SCHEDULES,
    MODEL_KINDS,
    MODEL_PRESETS,
    PRECISIONS,
    USER_MODEL_KIND,
    DataSpec,
    JobConfig,
    LayoutError,
    model_preset,
)
from runtime.storable import unstorable_path

MODEL_FIELDS = ("n_layer", "n_embd", "n_head", "seq_len", "vocab_size")
GPT_ONLY = ("n_head", "seq_len", "vocab_size")
DATA_FIELDS = ("source", "tokenizer", "val_every")
# The runtime's defaults (runtime/config.py owns them): the byte tokenizer, no validation.
DEFAULT_TOKENIZER = DataSpec().tokenizer
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JobConfig)}
DEFAULT_VAL_EVERY = _DEFAULTS["val_every"]
# The advanced training fields: JobConfig fields of the same name, sent only when filled in (else the
# runtime's defaults hold).
TRAINING_FIELDS = ("init_from", "lr", "lr_schedule", "warmup_steps", "lr_min", "clip", "precision", "device")
# Contract fields whose form field has another name (the rest land on the field named like their last part).
FIELD_FOR = {"config.model": "model", "config.model.path": "model",
             "config.model.args": "model_args", "config.model.layers": "model_layers"}
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
    model = forms.CharField(
        required=False, max_length=1000, label="Model preset or function",
        widget=forms.TextInput(attrs={"placeholder": "empty: the kind and sizes above", "list": "model-presets"}),
        help_text=f"a preset ({', '.join(MODEL_PRESETS)}) replaces the kind and sizes above; or your model "
                  "function as package.module:function (importable on the nodes: see Requirements)",
    )
    model_args = forms.CharField(required=False, label="Model function arguments (JSON object)",
                                 widget=forms.Textarea(attrs={"rows": 2, "placeholder": '{"width": 512}'}))
    model_layers = forms.IntegerField(
        min_value=1, required=False, label="Layers the function returns",
        help_text="model function only: the planner cuts them into stages (spotpipe submit records it for you)")
    global_batch = forms.IntegerField(min_value=1, initial=64, label="Global batch (samples per step)")
    requirements = forms.CharField(
        required=False, label="Requirements (one per line)",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "mypkg==1.2\nupload:<sha256>"}),
        help_text="pip requirements installed on every node before training: name==version, "
                  "s3://bucket/key.whl, or upload:<sha256> from POST /api/v1/packages/",
    )
    init_from = forms.CharField(required=False, max_length=1000, label="Start from weights",
                                help_text="a folder or s3://bucket/prefix a spotpipe job exported; empty: seeded")
    lr = forms.FloatField(required=False, initial=_DEFAULTS["lr"], label="Learning rate")
    lr_schedule = forms.ChoiceField(choices=[(name, name) for name in LR_SCHEDULES], initial=_DEFAULTS["lr_schedule"],
                                    label="Learning-rate schedule", required=False)
    warmup_steps = forms.IntegerField(required=False, min_value=0, initial=_DEFAULTS["warmup_steps"],
                                      label="Warmup steps")
    lr_min = forms.FloatField(required=False, initial=_DEFAULTS["lr_min"], label="Final learning rate (cosine)")
    clip = forms.FloatField(required=False, initial=_DEFAULTS["clip"], label="Clip gradient norm (0: no)")
    precision = forms.ChoiceField(choices=[(name, name) for name in PRECISIONS], initial=_DEFAULTS["precision"],
                                  label="Forward precision", required=False,
                                  help_text="bf16: bfloat16 autocast; fp16: float16 autocast with dynamic loss "
                                            "scaling (GPUs without bf16); weights and optimizer state stay float32")
    device = forms.ChoiceField(choices=[(name, name) for name in DEVICES], initial=_DEFAULTS["device"],
                               label="Device", required=False,
                               help_text="cuda: every node trains on one GPU of its own (its layers, optimizer state, "
                                         "activations and micro-batches); a node without a usable GPU fails the job")
    source = forms.CharField(
        required=False, max_length=1000, label="Data source (FORMAT:LOCATION)",
        widget=forms.TextInput(attrs={"placeholder": "text:s3://bucket/corpus/ (empty: synthetic tokens)"}),
        help_text="tokens:, text:, jsonl:PATH?field=NAME, hf:, wds: (WebDataset tars), mds: (MosaicML MDS), "
                  "shards: (prepared by spotpipe data prepare) or "
                  "py:module:function; a path on the nodes, a glob or an s3:// URI",
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
        ("Model", ("kind", *MODEL_FIELDS, "global_batch", "model", "model_args", "model_layers")),
        ("Data", DATA_FIELDS),
        ("Plan", ("plan_mode", "dp", "pp", "microbatches")),
        ("Deadline or budget (at least one)", ("deadline", "budget_usd")),
    )
    COLLAPSED = (("Advanced training", ("requirements", *TRAINING_FIELDS)),)
    """Groups shown folded until opened (or until one of their fields has an error)."""
    presets = tuple(MODEL_PRESETS)

    def __init__(self, *args: Any, teams: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams

    def fieldsets(self) -> list[tuple[str, list[forms.BoundField], bool | None]]:
        """(legend, fields, folded) per group: folded None for a group always shown, else whether the
        foldable group starts folded (it opens when one of its fields has an error)."""
        groups: list[tuple[str, tuple[str, ...], bool | None]] = [(legend, names, None) for legend, names in
                                                                  self.FIELDSETS]
        groups += [(legend, names, not any(self[n].errors for n in names)) for legend, names in self.COLLAPSED]
        return [(legend, [self[name] for name in names], folded) for legend, names, folded in groups]

    def clean_model(self) -> str:
        value = self.cleaned_data.get("model", "").strip()
        if value and ":" not in value:
            try:
                model_preset(value)  # the runtime's message names the presets there are
            except LayoutError as exc:
                raise ValidationError(exc.message) from None
        return value

    def clean_model_args(self) -> dict[str, Any] | None:
        text = self.cleaned_data.get("model_args", "").strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"not JSON ({exc}); expected an object such as {{\"width\": 512}}") from None
        except RecursionError:  # a short text nested thousands deep: the parser's stack, not a 500
            raise ValidationError("nested too deeply; expected a flat object such as {\"width\": 512}") from None
        if not isinstance(value, dict):
            raise ValidationError("expected a JSON object such as {\"width\": 512}")
        if found := unstorable_path(value, "model_args"):
            where, what = found
            raise ValidationError(f"{where} contains {what}")
        return value

    def clean_requirements(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data.get("requirements", "").splitlines() if line.strip()]

    def _model(self) -> dict[str, Any]:
        """The contract's model: a preset's fields, a user's function (`py`), or the kind and sizes."""
        data = self.cleaned_data
        name, args = data.get("model") or "", data.get("model_args")
        if ":" in name:
            model: dict[str, Any] = {"kind": USER_MODEL_KIND, "path": name}
            if data.get("model_layers") is not None:
                model["layers"] = data["model_layers"]
        elif name:
            model = dict(MODEL_PRESETS[name])
        else:
            model = {"kind": data["kind"]}
            for field in MODEL_FIELDS:
                if data.get(field) is not None and (data["kind"] == "gpt" or field not in GPT_ONLY):
                    model[field] = data[field]
        if args is not None:  # with a preset or a built-in kind the runtime refuses them, naming model.args
            model["args"] = args
        return model

    def config(self) -> dict[str, Any]:
        """The job contract (the runtime's JobConfig fields but the layout)."""
        data = self.cleaned_data
        config: dict[str, Any] = {"model": self._model(), "global_batch": data["global_batch"]}
        source, tokenizer = data.get("source") or "", data.get("tokenizer") or ""
        if source or tokenizer not in ("", DEFAULT_TOKENIZER):
            config["data"] = {"source": source, **({"tokenizer": tokenizer} if tokenizer else {})}
        if data.get("val_every") is not None:
            config["val_every"] = data["val_every"]
        if data.get("requirements"):
            config["requirements"] = data["requirements"]
        for name in TRAINING_FIELDS:
            if data.get(name) not in (None, ""):
                config[name] = data[name]
        return config

    def plan(self) -> dict[str, Any] | str:
        data = self.cleaned_data
        if data["plan_mode"] == "auto":
            return "auto"
        return {name: data[name] for name in ("dp", "pp", "microbatches") if data.get(name) is not None}

    def add_service_errors(self, error: ValidationError) -> None:
        """Attach `job_submit`'s errors (keyed `config.model.n_head`, `plan.dp`, `deadline`, ...) to fields."""
        for key, messages in error.message_dict.items():
            # `config.requirements[2]` lands on `requirements`, `config.model.path` on `model`.
            name = FIELD_FOR.get(key) or re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
            target = name if name in self.fields else None
            for message in messages:
                self.add_error(target, message if target else f"{key}: {message}")
