"""The job submission form. Validation of the job itself stays in `jobs.services.job_submit`; the
form only parses browser input (numbers, a datetime-local field) and shows the service's errors
next to the fields they name."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from controlplane.accounts.models import Team
from controlplane.jobs.models import Strategy

MODEL_FIELDS = ("layers", "d_model", "heads", "seq_len", "vocab", "global_batch", "micro_batches")


class JobSubmitForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.CharField(max_length=120)
    kind = forms.ChoiceField(choices=[("gpt", "GPT (transformer)"), ("mlp", "MLP")], initial="gpt",
                             label="Model kind")
    layers = forms.IntegerField(min_value=1, initial=8)
    d_model = forms.IntegerField(min_value=1, initial=256, label="Model width (d_model)")
    heads = forms.IntegerField(min_value=1, initial=8, required=False)
    seq_len = forms.IntegerField(min_value=1, initial=128, required=False, label="Sequence length")
    vocab = forms.IntegerField(min_value=1, initial=1024, required=False, label="Vocabulary")
    global_batch = forms.IntegerField(min_value=1, initial=64, label="Global batch")
    micro_batches = forms.IntegerField(min_value=1, initial=8, label="Micro-batches")
    strategy = forms.ChoiceField(choices=Strategy.choices, initial=Strategy.AUTO)
    target_steps = forms.IntegerField(min_value=1, initial=1000, label="Target steps")
    deadline = forms.DateTimeField(required=False, label="Deadline (UTC)",
                                   widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                   input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"])
    budget_usd = forms.DecimalField(required=False, min_value=0, decimal_places=2, max_digits=12,
                                    label="Budget (USD)")

    def __init__(self, *args: Any, teams: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams

    def model_spec(self) -> dict[str, Any]:
        data = self.cleaned_data
        spec: dict[str, Any] = {"kind": data["kind"]}
        for name in MODEL_FIELDS:
            if data.get(name) is not None and (data["kind"] == "gpt" or name not in ("heads", "seq_len", "vocab")):
                spec[name] = data[name]
        return spec

    def add_service_errors(self, error: ValidationError) -> None:
        """Attach `job_submit`'s errors (keyed `model_spec.heads`, `deadline`, ...) to fields."""
        for key, messages in error.message_dict.items():
            name = key.removeprefix("model_spec.")
            target = name if name in self.fields else None
            for message in messages:
                self.add_error(target, message if target else f"{key}: {message}")
