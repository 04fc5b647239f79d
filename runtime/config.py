"""The job contract: the model spec and the training layout, validated before any process starts.

This module is the one owner of the job's vocabulary: the strategy names (and what `auto` means),
the model kinds, every model/training field with its meaning and default, the grammar of a data
source (`FORMAT:LOCATION[?options]`, `parse_source`) and the one translation of the legacy
`model_spec` request body. The control plane validates a job by building its
`JobConfig` here (no torch import), stores `JobConfig.to_dict()` on the job, and the node agent
hands that dict to the runtime unchanged.

Configs are plain `kw_only`/`slots` dataclasses (torchtitan style) that round-trip through JSON, so
the node agent can hand them to `python -m runtime.train.trainer --spec JSON` unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from runtime.storable import unstorable

STRATEGIES = ("none", "checkpoint", "bamboo", "recycle", "oobleck")
"""Strategies the runtime runs (`none`: no fault tolerance, tests and baselines only)."""
AUTO_STRATEGY = "recycle"
"""What a job's `auto` runs: recycle keeps the global batch with no state transfer and no restart."""
JOB_STRATEGIES = ("auto", *(name for name in STRATEGIES if name != "none"))  # FAULT_TOLERANT_STRATEGIES + auto
"""Strategies a job may ask for."""
STRATEGY_LABELS = {
    "auto": "Automatic",
    "checkpoint": "Checkpoint-restart",
    "bamboo": "Bamboo (redundant computation)",
    "recycle": "ReCycle (re-route micro-batches)",
    "oobleck": "Oobleck (pipeline templates)",
    "none": "None (no fault tolerance)",
}
SCHEDULES = ("1f1b", "fiw")
LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("fp32", "bf16", "fp16")
"""Compute precisions of the forward (`JobConfig.precision`); parameters and optimizer state stay float32."""
DEVICES = ("cpu", "cuda")
"""Where a job computes (`JobConfig.device`); each node resolves `cuda` to one of its own GPUs
(`runtime.parallel.device.resolve_device`)."""
"""Learning-rate schedules after the warmup (`runtime.train.optim.lr_at`)."""
MODEL_KINDS = ("gpt", "mlp")
"""The built-in models (what the planner can estimate without building anything)."""
USER_MODEL_KIND = "py"
"""A user's model, built by the function at `ModelSpec.path` (see `runtime.models.usermodel`)."""
IMPORT_PATH_PATTERN = r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$"
"""`package.module:function` (a model function, a loss function or a `py:` dataset)."""
ARGS_MAX_BYTES = 65_536
"""The largest `model.args` (as JSON) a contract may carry."""
ARGS_MAX_DEPTH = 8
"""The deepest nesting of objects and lists `model.args` may have."""
REQUIREMENTS_MAX = 64
"""The most entries `requirements` may have."""
REQUIREMENT_MAX_CHARS = 500
"""The longest one `requirements` entry may be."""
MAX_SAMPLES = 2**63 - 1
"""The most samples a job may count (`step * global_batch`): the control plane stores the count in a
signed 64-bit column (`samples_done`)."""
MAX_GLOBAL_BATCH = 2**32
"""The largest `global_batch`. Every step a job can report is below 2**31 (the control plane's step
columns are 32-bit), so 2**32 samples a step keep `step * global_batch` within MAX_SAMPLES at any step,
while real jobs' batches (thousands to millions of samples) stay far below it."""
PACKAGE_SUFFIXES = (".whl", ".tar.gz", ".zip")
"""What a package file (an upload, an `s3://` requirement) may be: a wheel or an sdist archive."""
UPLOAD_PREFIX = "upload:"
"""`upload:<sha256>`: a package file uploaded to the control plane (`POST /api/v1/packages/`)."""


FAULT_TOLERANT_STRATEGIES = tuple(s for s in STRATEGIES if s != "none")
"""The strategies a job can survive preemptions with (what the simulator and the planner compare)."""
LAYOUT_FIELDS = ("dp", "pp", "microbatches", "strategy", "steps")
"""JobConfig fields a job's contract does not set: they come from its plan, strategy and target steps."""
PLAN_FIELDS = ("auto", "provider", "instance_types", "zones", "regions", "dp", "pp", "nodes", "microbatches",
               "max_nodes", "replan")
"""A job's `plan` fields (an API request's, a job file's): its layout, its nodes and where they come from
(the control plane's `planning.plans.parse_plan_request` reads them all, `spotpipe train` the layout)."""


def resolve_strategy(name: str) -> str:
    """The runtime strategy of a job's strategy name (`auto` and empty mean `AUTO_STRATEGY`)."""
    return AUTO_STRATEGY if name in ("", "auto") else name


class LayoutError(ValueError):
    """An impossible layout or configuration; the message names the value and what was expected.

    `field` is the contract field to change (`pp`, `model.n_head`, ...), empty when no single field is
    to blame; the control plane answers 400 under that name."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class LayoutErrors(LayoutError):
    """Several problems at once (`errors`), so a request hears of all of them in one answer."""

    def __init__(self, errors: list[LayoutError]) -> None:
        super().__init__("; ".join(e.message for e in errors), field=errors[0].field)
        self.errors = errors


def each_error(exc: LayoutError) -> list[LayoutError]:
    """The single problems of `exc` (one, or those of a `LayoutErrors`)."""
    return list(getattr(exc, "errors", [exc]))


def _raise(problems: list[LayoutError]) -> None:
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise LayoutErrors(problems)


EXPORT_FORMATS = ("hf",)
"""`export` (job contract, job file, `spotpipe train --export`): hf also writes the final weights as a
Hugging Face GPT-2 folder (`runtime.train.hf_folder.write_hf_folder`)."""
_UNSET = -(2**60)  # beyond any integer a contract may hold (`_check_value`): never a user's value
_BUILT_IN_DEFAULTS = {"seq_len": 16, "vocab_size": 64}
"""A built-in model's context and vocabulary when not set; a user's model has none until declared."""
MODEL_FIELDS: dict[str, tuple[str, ...]] = {
    "gpt": ("kind", "n_layer", "n_embd", "n_head", "seq_len", "vocab_size"),
    "mlp": ("kind", "n_layer", "n_embd", "in_features", "vocab_size"),
    "py": ("kind", "path", "args", "loss", "layers", "seq_len", "vocab_size", "language_model", "layer_measures"),
}
"""Which `ModelSpec` fields mean something for each kind (the rest are left out of its dict)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerMeasure:
    """One layer of a user's model for one sample, as `runtime.train.model_check.validate_model`
    measures it on torch's meta device where the code is (no compute, any size): what the planner
    predicts the layer's times and memory from (`plan: auto`), and what tells the partitioner
    which layers hold no parameters. A micro-batch of n samples costs `fixed_* + n * per sample`
    (measured at one and two samples: a layer saves its weights for the backward, and may compute on
    them, whatever the samples)."""

    parameters: int
    """Parameters the layer holds (0: it joins a neighbour's stage)."""
    forward_flops: float
    """Floating-point operations of the forward, per sample."""
    activation_bytes: float
    """Bytes the forward saves for the backward, per sample."""
    fixed_forward_flops: float = 0.0
    """Floating-point operations of the forward whatever the samples."""
    fixed_activation_bytes: float = 0.0
    """Bytes the forward saves for the backward whatever the samples (its weights, mostly)."""
    output_bytes: float
    """Bytes of the layer's output, per sample (what a stage boundary after it sends)."""
    kernels: int = 1
    """Kernels the forward launches (the per-kernel overhead of small layers)."""
    input_grad: bool = True
    """Whether the layer's input takes a gradient (not for the first layer, nor integer inputs)."""

    def problems(self, path: str) -> list[LayoutError]:
        """Every value out of range, named by its dotted path."""
        return [LayoutError(f"{path}.{name}={getattr(self, name)!r} must be >= 0", field=f"{path}.{name}")
                for name in ("parameters", "forward_flops", "activation_bytes", "fixed_forward_flops",
                             "fixed_activation_bytes", "output_bytes", "kernels")
                if getattr(self, name) < 0]


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """Which model to build: always a list of layers the partitioner cuts into stages.

    The built-in kinds are input layer, `n_layer` blocks, head; a user's model (`kind="py"`) is the
    list of layers its function at `path` returns (see `runtime.models.usermodel` and docs/runtime.md)."""

    kind: str = "mlp"
    """`gpt` (nanoGPT-style decoder), `mlp` (tanh MLP classifier, for fast tests) or `py` (a user's
    model function at `path`)."""
    path: str = ""
    """py only: the model function, `package.module:function`, importable on every node; it returns an
    `nn.Sequential`, a list of `nn.Module` layers, or a list of zero-argument layer factories."""
    args: dict[str, Any] = field(default_factory=dict)
    """py only: the keyword arguments the model function is called with (a JSON object)."""
    loss: str = ""
    """py only: `package.module:function` of the loss, `loss(output, target) -> scalar tensor`;
    empty: mean cross-entropy over the last dimension."""
    layers: int = 0
    """py only: how many layers the function returns, recorded by `runtime.train.model_check.validate_model`
    (`spotpipe train` / `spotpipe submit` run it); 0: not validated yet (a node records it at start)."""
    n_layer: int = 4
    """Number of transformer blocks (gpt) or hidden layers (mlp); the model has n_layer + 2 layers."""
    n_embd: int = 32
    """Width: embedding size (gpt) or hidden size (mlp)."""
    n_head: int = 2
    """Attention heads (gpt only); must divide n_embd."""
    seq_len: int = _UNSET
    """Context in tokens: the length of the data's token windows (gpt: 16 unless set; py: declared by
    the model function (`spotpipe.Model`) or set, needed when the data are token windows; 0: not
    declared)."""
    vocab_size: int = _UNSET
    """Vocabulary size (gpt: 64 unless set; py: declared or set, needed when the data are token
    windows, at least the tokenizer's ids; 0: not declared) or number of classes (mlp: 64 unless set)."""
    in_features: int = 16
    """Input features (mlp only)."""
    language_model: bool | None = None
    """py only: whether the model's output is logits over `vocab_size` tokens at each position (what
    `spotpipe sample` needs). None: a model with a vocabulary trained on token windows is one."""
    layer_measures: list[LayerMeasure] = field(default_factory=list)
    """py only: each layer measured for one sample, recorded with `layers` by `validate_model`;
    empty: not measured (the planner cannot plan the model, and every layer is taken to hold
    parameters)."""

    def __post_init__(self) -> None:
        for name, default in _BUILT_IN_DEFAULTS.items():
            if getattr(self, name) == _UNSET:
                setattr(self, name, 0 if self.kind == USER_MODEL_KIND else default)
        # A profile's stored model dict (`ModelProfile.spec`) holds the measures as plain dicts.
        self.layer_measures = [m if isinstance(m, LayerMeasure) else LayerMeasure(**m) for m in self.layer_measures]

    def to_dict(self) -> dict[str, Any]:
        """The fields of this model's kind only (what spotpipe.json, the API and the job page show)."""
        out = {name: getattr(self, name) for name in MODEL_FIELDS[self.kind if self.kind in MODEL_FIELDS else "mlp"]}
        if "layer_measures" in out:
            out["layer_measures"] = [dataclasses.asdict(m) for m in self.layer_measures]
        return out

    @property
    def is_language_model(self) -> bool:
        """Logits over `vocab_size` tokens at each position (the GPT; a user's model that says so, or
        that has a vocabulary and was not declared otherwise)."""
        if self.kind == "gpt":
            return True
        if self.kind == USER_MODEL_KIND:
            return self.language_model if self.language_model is not None else self.vocab_size > 0
        return False

    @property
    def num_layers(self) -> int:
        """Layers the partitioner can place: input layer + blocks + head (py: `layers`)."""
        return self.layers if self.kind == USER_MODEL_KIND else self.n_layer + 2

    @property
    def max_stages(self) -> int:
        """The most pipeline stages the model can be cut into: one per layer holding parameters (a
        layer without joins a neighbour's stage; `runtime.parallel.partition`)."""
        parameters = self.layer_parameters()
        return self.num_layers if parameters is None else sum(1 for p in parameters if p > 0)

    def layer_parameters(self) -> list[int] | None:
        """Parameters of each layer: of a built-in model, what `runtime.models.model.build_layer`
        makes, counted without building it; of a user's model, as measured (`layer_measures`), None
        when it was not (only its code knows)."""
        if self.kind == USER_MODEL_KIND:
            return [m.parameters for m in self.layer_measures] or None
        c, v = self.n_embd, self.vocab_size
        if self.kind == "gpt":
            block = 12 * c * c + 13 * c  # ln_1, c_attn (3c, bias), c_proj, ln_2, mlp_fc (4c), mlp_proj
            return [(v + self.seq_len) * c] + [block] * self.n_layer + [2 * c + c * v]  # head: ln_f, no bias
        return [(self.in_features + 1) * c] + [(c + 1) * c] * self.n_layer + [(c + 1) * v]

    def problems(self) -> list[LayoutError]:
        """Every reason this model cannot be built (empty when it can)."""
        found = []
        kinds = (*MODEL_KINDS, USER_MODEL_KIND)
        if self.kind not in kinds:
            found.append(LayoutError(f"model kind {self.kind!r} is unknown; expected one of {kinds}",
                                     field="model.kind"))
        if self.kind == USER_MODEL_KIND:
            if not re.match(IMPORT_PATH_PATTERN, self.path):
                found.append(LayoutError(f"model.path {self.path!r} is invalid; expected the model function as "
                                         "package.module:function", field="model.path"))
            if self.loss and not re.match(IMPORT_PATH_PATTERN, self.loss):
                found.append(LayoutError(f"model.loss {self.loss!r} is invalid; expected empty (cross-entropy) or "
                                         "a loss function as package.module:function", field="model.loss"))
            if self.layers < 0:
                found.append(LayoutError(f"model.layers={self.layers} must be >= 0 (0: not validated yet)",
                                         field="model.layers"))
            for name in ("seq_len", "vocab_size"):
                if getattr(self, name) < 0:
                    found.append(LayoutError(f"model.{name}={getattr(self, name)} must be >= 0 (0: not declared)",
                                             field=f"model.{name}"))
            found += self._measure_problems()
            return found
        if self.language_model is not None:
            found.append(LayoutError(f"model.language_model is for a user's model (kind={USER_MODEL_KIND!r}); "
                                     f"kind={self.kind!r} says what it is itself", field="model.language_model"))
        for name in ("path", "loss"):
            if getattr(self, name):
                found.append(LayoutError(f"model.{name} is for a user's model; expected kind={USER_MODEL_KIND!r} "
                                         f"with it, or no {name} for kind={self.kind!r}", field=f"model.{name}"))
        if self.args or self.layers or self.layer_measures:
            name = "args" if self.args else "layers" if self.layers else "layer_measures"
            found.append(LayoutError(f"model.{name} is for a user's model (kind={USER_MODEL_KIND!r}); "
                                     f"expected none for kind={self.kind!r}", field=f"model.{name}"))
        for name in ("n_layer", "n_embd", "seq_len", "vocab_size", "in_features", "n_head"):
            if getattr(self, name) < 1:
                found.append(LayoutError(f"model {name}={getattr(self, name)} must be at least 1",
                                         field=f"model.{name}"))
        if self.kind == "gpt" and self.n_head >= 1 and self.n_embd % self.n_head:
            found.append(LayoutError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}",
                                     field="model.n_head"))
        return found

    def _measure_problems(self) -> list[LayoutError]:
        """A user's model's `layer_measures`: one per layer, values in range, some layer with parameters."""
        measures = self.layer_measures
        if not measures:
            return []
        found = [p for i, m in enumerate(measures) for p in m.problems(f"model.layer_measures[{i}]")]
        if self.layers and len(measures) != self.layers:
            found.append(LayoutError(f"model.layer_measures has {len(measures)} entries; expected model.layers="
                                     f"{self.layers} (one per layer)", field="model.layer_measures"))
        if not any(m.parameters > 0 for m in measures):
            found.append(LayoutError("model.layer_measures says no layer holds parameters; expected at least one "
                                     "layer with parameters to train", field="model.layer_measures"))
        return found

    def validate(self) -> None:
        """Raise `LayoutError` for a model that cannot be built."""
        _raise(self.problems())


GPT2_VOCAB_SIZE = 50257
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "gpt-nano": {"kind": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128, "seq_len": 128, "vocab_size": 256},
    "gpt2": {"kind": "gpt", "n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 1024, "vocab_size": GPT2_VOCAB_SIZE},
    "gpt2-medium": {"kind": "gpt", "n_layer": 24, "n_head": 16, "n_embd": 1024, "seq_len": 1024,
                    "vocab_size": GPT2_VOCAB_SIZE},
    "gpt2-large": {"kind": "gpt", "n_layer": 36, "n_head": 20, "n_embd": 1280, "seq_len": 1024,
                   "vocab_size": GPT2_VOCAB_SIZE},
    "gpt2-xl": {"kind": "gpt", "n_layer": 48, "n_head": 25, "n_embd": 1600, "seq_len": 1024,
                "vocab_size": GPT2_VOCAB_SIZE},
}
"""Named models (`--model gpt2`): ModelSpec fields. gpt-nano is the demo's byte-level GPT; the gpt2
presets have GPT-2's shapes (blocks, heads, width, context), with the input embedding and the output
head untied (GPT-2 ties them: these have 38.6M (gpt2) to 80.4M (gpt2-xl) more parameters). The
vocabulary is the job's tokenizer's when it has one (`preset_for_tokenizer`), else GPT-2's 50,257."""


def preset_vocabulary(tokenizer_vocab: int | None, name: str) -> int:
    """The vocabulary of preset `name` for a job whose tokenizer has `tokenizer_vocab` ids (None: no tokenizer)."""
    return tokenizer_vocab if tokenizer_vocab is not None else MODEL_PRESETS[name]["vocab_size"]


def model_preset(name: str) -> ModelSpec:
    """The ModelSpec of a preset name; raises `LayoutError` naming the presets there are."""
    if name not in MODEL_PRESETS:
        raise LayoutError(f"model {name!r} is unknown; expected one of {sorted(MODEL_PRESETS)}", field="model")
    return ModelSpec(**MODEL_PRESETS[name])


BYTE_VOCAB_SIZE = 256
"""Token ids of the built-in byte-level tokenizer: one per byte value."""
TOKENIZED_FORMATS = ("text", "jsonl", "hf", "wds", "mds", "shards")
"""Source formats whose documents go through the job's tokenizer (`shards` went through it when
they were prepared; `tokens` are ids already, `py` datasets give tensors): the model's vocabulary
must cover the tokenizer's for these."""
TOKEN_WINDOW_FORMATS = ("tokens", *TOKENIZED_FORMATS)
"""Source formats whose samples are windows of `model.seq_len` token ids (`py` datasets give their own)."""


# --- Data sources: `FORMAT:LOCATION[?key=value&...]` ------------------------------------------------
# One string names a job's data on the command line, in the API and in the dashboard:
# `tokens:data/shakespeare` (nanoGPT's train.bin + val.bin), `text:s3://bucket/corpus/`,
# `jsonl:data/*.jsonl?field=body`, `hf:data/wiki?column=text`, `py:mypkg.data:build`.

DATA_FORMATS = (*TOKEN_WINDOW_FORMATS, "py")
"""Formats a source may name: nanoGPT token files, UTF-8 text, JSON Lines, Hugging Face `datasets`
folders, WebDataset tars and MosaicML MDS shards of text, a corpus prepared by `spotpipe data prepare` (shards), and a
user's map-style dataset by import path."""
FORMAT_OPTIONS: dict[str, dict[str, str]] = {
    "tokens": {"dtype": "uint16"},
    "text": {},
    "jsonl": {"field": "text"},
    "wds": {"field": "txt"},
    "mds": {"field": "text"},
    "hf": {"column": "text", "split": "train"},
    "py": {},
    "shards": {},
}
"""Options each format takes after `?`, with their defaults."""
PREPARABLE_FORMATS = ("text", "jsonl", "hf", "wds", "mds")
"""Formats `spotpipe data prepare` (and a job's `data.prepare` step) tokenizes into `shards:`;
`tokens:` and `py:` sources are read as they are."""
TOKEN_DTYPES = ("uint16", "uint32")
_FIELD = "data.source"


@dataclass(frozen=True, slots=True)
class SourceURI:
    """A parsed data source."""

    format: str
    """One of `DATA_FORMATS`."""
    location: str
    """A local path or glob, an `s3://bucket/prefix` URI, or (py) `package.module:function`."""
    options: dict[str, str] = field(default_factory=dict)
    """The format's options, defaults filled in."""

    @property
    def is_s3(self) -> bool:
        return self.location.startswith("s3://")

    @property
    def bucket(self) -> str:
        """The S3 bucket (s3 locations only)."""
        return self.location.removeprefix("s3://").split("/", 1)[0]

    @property
    def key_prefix(self) -> str:
        """The S3 key or prefix (s3 locations only)."""
        rest = self.location.removeprefix("s3://").split("/", 1)
        return rest[1] if len(rest) > 1 else ""

    def __str__(self) -> str:
        given = {k: v for k, v in self.options.items() if v != FORMAT_OPTIONS[self.format].get(k)}
        query = f"?{urllib.parse.urlencode(given)}" if given else ""
        return f"{self.format}:{self.location}{query}"


def _bad(text: str, expected: str, field: str = _FIELD) -> LayoutError:
    return LayoutError(f"{field} {text!r} is invalid: {expected}", field=field)


def parse_source(text: str, *, field: str = _FIELD) -> SourceURI:
    """Parse `FORMAT:LOCATION[?options]`; raises `LayoutError` naming `field` and what was expected."""
    fmt, sep, rest = text.partition(":")
    if not sep or fmt not in DATA_FORMATS:
        raise _bad(text, f"expected FORMAT:LOCATION with FORMAT one of {DATA_FORMATS} "
                         "(for example text:corpus/ or tokens:data/train.bin)", field)
    location, _, query = rest.partition("?")
    if not location or location.strip() != location:
        raise _bad(text, "the location after the format is empty or has surrounding spaces", field)
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise _bad(text, f"the options after '?' must be key=value pairs joined by '&', got {query!r}", field) from None
    known = FORMAT_OPTIONS[fmt]
    options = dict(known)
    for key, value in pairs:
        if key not in known:
            allowed = ", ".join(known) or "none"
            raise _bad(text, f"option {key!r} is unknown for {fmt}: sources; expected {allowed}", field)
        if not value:
            raise _bad(text, f"option {key!r} is empty", field)
        options[key] = value
    if fmt == "tokens" and options["dtype"] not in TOKEN_DTYPES:
        raise _bad(text, f"dtype={options['dtype']!r}; expected one of {TOKEN_DTYPES}", field)
    if fmt == "shards" and "://" not in location and any(c in location for c in "*["):
        raise _bad(text, "a shards: location is a folder or an s3://bucket/prefix/, not a glob", field)
    if fmt == "py":
        if not re.match(IMPORT_PATH_PATTERN, location):
            raise _bad(text, "py: sources name a function as package.module:function", field)
    elif location.startswith("s3://"):
        _check_bucket(text, location, field)
    elif "://" in location:
        raise _bad(text, "the location must be a local path, a glob or an s3://bucket/prefix URI", field)
    return SourceURI(format=fmt, location=location, options=options)


def _check_bucket(text: str, location: str, field: str) -> None:
    bucket = location.removeprefix("s3://").split("/", 1)[0]
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
        raise _bad(text, f"s3 bucket {bucket!r} is not a valid bucket name (3-63 lower-case letters, "
                         "digits, dots and hyphens)", field)


def check_prepare(source: str, out: str, *, field: str = "data.prepare") -> None:
    """A job's `data.prepare` step: `source` (its `data.source`) must be of a preparable format and
    `out` a folder or `s3://bucket/prefix/` that a `shards:` source can read; raises `LayoutError`."""
    if not source:
        raise _bad(out, "a prepare step needs a data.source to prepare", field)
    fmt = source.partition(":")[0]
    if fmt not in PREPARABLE_FORMATS:
        raise _bad(out, f"only {', '.join(PREPARABLE_FORMATS)} sources are prepared; data.source is {fmt}:", field)
    if not out or out.strip() != out or ("://" in out and not out.startswith("s3://")) \
            or any(c in out for c in "*?["):
        raise _bad(out, "expected a folder or an s3://bucket/prefix/ (not a glob)", field)
    if out.startswith("s3://"):
        _check_bucket(out, out, field)


def check_tokenizer(text: str, *, field: str = "data.tokenizer") -> None:
    """`byte`, or the path (or s3:// URI) of a Hugging Face `tokenizer.json`; raises `LayoutError`."""
    if text == "byte":
        return
    if not text or text.strip() != text:
        raise _bad(text, "expected 'byte' or the path of a tokenizer.json", field)
    if "://" in text and not text.startswith("s3://"):
        raise _bad(text, "a tokenizer is 'byte', a local path or an s3://bucket/key URI", field)


MIN_CACHE_BYTES = 1 << 16
"""The smallest `data.cache_bytes` (64 KiB): a cache that small still works, fetching every page again."""


@dataclass(kw_only=True, slots=True)
class DataSpec:
    """Where the job's samples come from. Empty `source`: synthetic random samples (tests, benchmarks)."""

    source: str = ""
    """`FORMAT:LOCATION[?options]` (`parse_source`), or empty for synthetic data."""
    tokenizer: str = "byte"
    """text/jsonl/hf sources: `byte` (built in, vocabulary 256) or the path of a Hugging Face tokenizer.json."""
    val_fraction: float = 0.05
    """Share of the tokens (or items) held out for validation, from the end, when the source has no
    validation split of its own (nanoGPT's val.bin)."""
    val_batches: int = 4
    """Held-out batches of `global_batch` samples each that a validation pass computes the loss on."""
    cache_bytes: int = 20 << 30
    """The most each of the node's data caches holds (`shards:` pages; tokenized corpora and S3
    mirrors): least recently used entries are evicted to stay within it."""
    prepare: str = ""
    """A folder or `s3://bucket/prefix/` to prepare `source` into once, before training, each of the
    job's nodes tokenizing a share of its files (`spotpipe data prepare --share`); the job then trains
    on `shards:` of it. Empty: no prepare step. A location that holds the same source's corpus already
    is trained on as it is."""

    def prepared(self) -> DataSpec:
        """This spec once its prepare step is over: it reads `shards:` of the prepared location."""
        return dataclasses.replace(self, source=f"shards:{self.prepare}", prepare="")

    @property
    def tokenized(self) -> bool:
        """True when the source's documents go through `tokenizer` (see `TOKENIZED_FORMATS`)."""
        return self.source.partition(":")[0] in TOKENIZED_FORMATS

    def problems(self) -> list[LayoutError]:
        """Every reason this data spec is malformed (what only a node can check is checked there)."""
        found = []
        for name, check in (("source", parse_source), ("tokenizer", check_tokenizer)):
            value = getattr(self, name)
            if name == "source" and not value:
                continue
            try:
                check(value)
            except LayoutError as exc:
                found.append(exc)
        if self.prepare:
            try:
                check_prepare(self.source, self.prepare)
            except LayoutError as exc:
                found.append(exc)
        if not 0 < self.val_fraction < 1:
            found.append(LayoutError(f"data.val_fraction={self.val_fraction} must be between 0 and 1 (exclusive)",
                                     field="data.val_fraction"))
        if self.val_batches < 1:
            found.append(LayoutError(f"data.val_batches={self.val_batches} must be at least 1",
                                     field="data.val_batches"))
        if self.cache_bytes < MIN_CACHE_BYTES:
            found.append(LayoutError(f"data.cache_bytes={self.cache_bytes} must be at least {MIN_CACHE_BYTES} "
                                     "(64 KiB)", field="data.cache_bytes"))
        return found


@dataclass(kw_only=True, slots=True)
class DeviceTime:
    """Emulated device time: every compute action is padded (with sleep) to this profiled duration.

    On 2 CPU cores several stages cannot compute at once, so pipeline bubbles are not real; padding
    each action to a per-layer duration lets the sleeping stages overlap as devices would.
    """

    forward_ms: float = 2.0
    """Forward time of one layer for one micro-batch."""
    backward_input_ms: float = 2.0
    """Backward-input (activation gradient) time of one layer for one micro-batch."""
    backward_weight_ms: float = 2.0
    """Backward-weight (parameter gradient) time of one layer for one micro-batch."""


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """Everything that fixes the math of a run: model, layout, data order, optimizer."""

    model: ModelSpec = field(default_factory=ModelSpec)
    """The model to train."""
    dp: int = 2
    """Data-parallel degree: number of pipelines."""
    pp: int = 2
    """Pipeline-parallel degree: stages per pipeline."""
    microbatches: int = 4
    """Micro-batches per pipeline per step; the step has dp * microbatches micro-batches in all."""
    global_batch: int = 16
    """Samples per optimizer step, the same under every membership (the math must not change)."""
    strategy: str = "none"
    """Fault tolerance: none, checkpoint, bamboo, recycle or oobleck."""
    schedule: str = "1f1b"
    """Pipeline schedule: `1f1b` (fused backward) or `fiw` (backward split into input and weight)."""
    seed: int = 0
    """Seeds the initial parameters and the data order."""
    data: DataSpec = field(default_factory=DataSpec)
    """What the job trains on (default: synthetic random samples)."""
    val_every: int = 0
    """Compute the validation loss every this many steps (and after the last); 0: never."""
    steps: int = 4
    """Optimizer steps to run."""
    lr: float = 1e-2
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    weight_decay_min_dim: int = 0
    """Decay only parameters with at least this many dimensions: 0 (the default, as before) decays
    all; 2 decays matrices and embeddings but not biases and norm weights (nanoGPT's groups)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW (beta1, beta2), each in [0, 1)."""
    eps: float = 1e-8
    """AdamW epsilon (added to the root of the second moment)."""
    lr_schedule: str = "constant"
    """`constant` (lr after the warmup) or `cosine` (after the warmup, cosine decay from lr to lr_min at
    the last step); see `runtime.train.optim.lr_at`."""
    warmup_steps: int = 0
    """Linear warmup: step s < warmup_steps gets lr * (s + 1) / warmup_steps; 0: none."""
    lr_min: float = 0.0
    """cosine: the learning rate of the last step (0 <= lr_min <= lr)."""
    clip: float = 0.0
    """Clip the global gradient norm (over all layers, after the all-reduce) to this; 0: no clipping."""
    skip_nonfinite: bool = False
    """Skip (on every node alike) a step whose global gradient norm is not finite, and count it
    (always so when `clip` > 0). Off by default: the norm exchange it needs is one more round trip per
    step, measured +6 to +22 ms on a 46-52 ms step of a tiny model on 2 shared cores (4 processes)."""
    recompute: bool = False
    """Activation recomputation per layer: keep only each layer's input, recompute its activations in
    the backward (less memory, about one more forward of compute); the same math."""
    precision: str = "fp32"
    """`fp32`, `bf16` or `fp16`: each layer's forward (and its recompute) under bfloat16 or float16
    autocast (`runtime.models.rng.forward_layer`); parameters, gradients and AdamW state stay float32.
    fp16 (GPUs without bf16: the V100 and T4 of the p3 and g4dn fleets) scales the loss dynamically
    (`runtime.train.loss_scale`) and skips, on every node alike, a step whose gradients overflowed."""
    loss_scale_init: float = 65536.0
    """fp16: the loss scale of the first step (a power of two; torch's GradScaler's default)."""
    loss_scale_growth_interval: int = 2000
    """fp16: the scale doubles after this many steps in a row without an overflow, and halves at each
    overflow (a skipped step), as torch's GradScaler does."""
    device: str = "cpu"
    """`cpu` or `cuda`: where every node keeps its layers, optimizer state, activations and the data's
    micro-batches (`runtime.parallel.device`). With `cuda` each node uses one GPU of its own VM (the
    agent's device index, in `CUDA_VISIBLE_DEVICES` numbering); messages between nodes still travel
    over gloo through pinned host memory, and a node without a usable GPU fails the job naming why."""
    layer_costs: list[float] | None = None
    """Cost per layer (forward+backward) for balancing stages, read as seconds per micro-batch where
    a time scale is needed (`runtime.strategies.links`); None = estimate. Measured, or for a job the
    control plane plans, the planner's seconds on the chosen type (`links.stated_by_cost_models`)."""
    device_time: DeviceTime | None = None
    """Emulated device time per action (None: real compute time only)."""
    op_timeout_s: float = 1.5
    """The floor of the timeout of every blocking collective / point-to-point call of a training step
    (`step_timeout`): a job whose steps are short detects a hung peer within it. The bound grows with
    the measured step time (`op_timeout_factor`), so a long step is not mistaken for a failure. It
    does not bound state hand-overs (`transfer_timeout_s`)."""
    op_timeout_factor: float = 3.0
    """A step's calls are bounded by max(op_timeout_s, op_timeout_factor x the step time expected from
    the slowest step measured so far), see `step_timeout`: no call waits longer than a whole step
    legitimately takes, and the factor covers a step slower than those before (a loaded machine)."""
    first_step_timeout_s: float = 0.0
    """The bound of the calls of a step when nothing was measured yet (a process's first step, a
    replacement's); 0 (the default) derives it from the model's work (`first_step_timeout`)."""
    compute_floor_gflop_s: float = 1.0
    """The compute rate (GFLOP/s, whole pipeline) a first step is assumed to get at least, to derive
    `first_step_timeout_s`: a GPT-2 step of one 1,024-token sample (about 1 TFLOP) measured 61 s
    (16 GFLOP/s) on 2 shared CPU cores, so the derived bound (1,000 s) fails only a stuck step."""
    transfer_timeout_s: float = 0.0
    """Timeout of every call of a state hand-over (layers and optimizer state moved at a regroup, on a
    short-lived transfer group); 0 (the default) derives it per hand-over (`transfer_timeout`). A
    layer of hundreds of MB takes seconds over a network, far over `op_timeout_s`; a hung peer in a
    hand-over is detected within this bound (bystanders within `heartbeat_timeout_s`)."""
    transfer_floor_mb_s: float = 50.0
    """The bandwidth (MB/s, 10^6 bytes) a hand-over is assumed to get at least, to derive
    `transfer_timeout_s`: 50 MB/s (400 Mbit/s) is below what one TCP flow gets between cloud VMs,
    even across zones, so the derived bound fails a slow transfer only when something is wrong."""
    heartbeat_timeout_s: float = 3.0
    """A member whose heartbeat is older than this is declared dead at rendezvous (after op_timeout_s
    of waiting, one that has not answered and whose heartbeat is older than 1.5 x op_timeout_s is too)."""
    rendezvous_timeout_s: float = 60.0
    """Upper bound on waiting for a generation to form."""
    join_wait_s: float = 600.0
    """Strategies that restart from a checkpoint: how long survivors too few for one pipeline wait for
    replacements to join before the job fails."""
    join_batch_wait_s: float = 600.0
    """Strategies whose regroup is a restart or a re-instantiation (checkpoint, oobleck): the longest a
    joiner that found an empty slot waits for more joiners before the job regroups for it anyway
    (`runtime.distributed.membership.joiners_worth_a_regroup`); 0 takes every joiner at once."""
    recycle_spill: bool = True
    """recycle: True (the default) lets a lost hop go to any survivor (which fetches that stage's
    layers) when the schedule estimate says the step is shorter -- needed when few pipelines leave one
    peer doing twice the work; False sends it to same-stage peers only, ReCycle as published (see
    docs/runtime.md)."""
    link_gbps: float = 10.0
    """recycle: the point-to-point bandwidth between nodes (Gbit/s) that spill prices a stage's traffic
    with (`runtime.strategies.links`): a host that takes on a stage it does not hold joins that
    stage's gradient all-reduce, so spill moves a hop off the same-stage peers only where the compute
    it saves outweighs that. Stated, not measured: every survivor must compute the same plan, so its
    inputs are the contract's. 10 (the default) is the simulator's cost model and the "up to 10
    Gigabit" of the p3.2xlarge / g5.xlarge class; 0 scores compute only (spill before 2026-11-27).
    A job the control plane plans states its instance type's bandwidth (`links.stated_by_cost_models`)."""
    min_stages: int = 1
    """oobleck: the fewest nodes a pipeline template may have (the model must fit on them)."""
    init_from: str = ""
    """Start from earlier weights: a folder (or s3://bucket/prefix) a spotpipe job exported
    (model*.safetensors + spotpipe.json). With its optimizer state the job continues that one at its
    steps_done (`steps` stays the total); with weights only it starts at step 0. Or a Hugging Face
    GPT-2 folder (config.json + model.safetensors; weights only, `runtime.models.hf_gpt2`). Empty: seeded init."""
    requirements: list[str] = field(default_factory=list)
    """Python packages the nodes install (pip) before the runtime starts, into a per-job virtualenv
    over the node's environment: PEP 508 specifiers (`mypkg==1.2`), `s3://bucket/key.whl` (or
    .tar.gz/.zip) files, or `upload:<sha256>` packages uploaded to the control plane. Empty: none
    (the node's environment as is); see `requirement_problem` and docs/runtime.md."""
    export_shard_bytes: int = 2 * 10**9
    """The largest safetensors shard of an exported model (bytes); a writer's tensors past it go to
    its next shard (see runtime/checkpointing/export.py)."""
    export: str = ""
    """Another format the final weights are also written in, beside them (`EXPORT_FORMATS`): `hf`, a
    Hugging Face GPT-2 folder `hf/` (gpt presets), written by the node that completes the export;
    empty: spotpipe's safetensors only."""
    checkpoint_dir: str = ""
    """Where checkpoints go (every strategy; local directory or s3://bucket/prefix) when the job has no
    export dir; empty means a per-job temporary directory (`runtime.checkpointing.checkpoints.checkpoint_root`)."""
    checkpoint_interval: int = 0
    """Steps between checkpoints; 0 derives it from Young/Daly (`runtime.checkpointing.durability`)."""
    mtbf_s: float = 3600.0
    """Prior (and ceiling) of the job's mean time between failures, for Young/Daly; the failures the
    job sees pull the estimate down (`runtime.checkpointing.durability.estimated_mtbf_s`)."""
    checkpoint_cost_s: float = 0.05
    """Prior of the time to write one checkpoint, for Young/Daly, until a write is measured."""
    step_time_s: float = 0.1
    """Prior of the time of one step, to turn the Young/Daly period into steps, until steps are measured."""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step over all pipelines (constant under every membership)."""
        return self.dp * self.microbatches

    @property
    def microbatch_size(self) -> int:
        """Samples per micro-batch."""
        return self.global_batch // self.num_microbatches

    @property
    def num_nodes(self) -> int:
        """Nodes of the full layout."""
        return self.dp * self.pp

    def transfer_timeout(self, nbytes: int) -> float:
        """The bound of each call of a hand-over that moves `nbytes` in all (every message of it).

        `transfer_timeout_s` if set, else op_timeout_s + nbytes / transfer_floor_mb_s: the op timeout
        covers a message's latency and scheduling hiccups, as in a step, and the second term is the
        time the bytes take at the floor bandwidth. All the hand-over's bytes are counted, not one
        message's: a receiver's call may wait while its source sends to others first, so the
        hand-over's whole traffic through one link is the most any call can legitimately wait.
        Every node derives the same bound from the plan. Tiny test models get about op_timeout_s; a
        GPT-2 XL block (d=1600, 30.7M parameters, sent as params + two AdamW moments in float64,
        738 MB) gets op_timeout_s + 14.8 s.
        """
        if self.transfer_timeout_s > 0:
            return self.transfer_timeout_s
        return self.op_timeout_s + nbytes / (self.transfer_floor_mb_s * 1e6)

    def first_step_timeout(self, flop: float) -> float:
        """The bound of each call of a step with no measured step before it, for a step of `flop`
        floating-point operations in all (`runtime.train.trainer` counts 6 x parameters x tokens of the
        global batch): `first_step_timeout_s` if set, else op_timeout_s + flop / compute_floor_gflop_s.
        Tiny test models get about op_timeout_s; GPT-2 (163M parameters untied, 1,024 tokens) about
        1,000 s per sample."""
        if self.first_step_timeout_s > 0:
            return self.first_step_timeout_s
        return self.op_timeout_s + flop / (self.compute_floor_gflop_s * 1e9)

    def step_timeout(self, expected_s: float | None, *, first_s: float) -> float:
        """The bound of every blocking call of a training step (receives, all-reduce parts, the
        commit, the sends awaited at its end).

        `expected_s`: the step time this node expects from its measurements, None before any (then
        `first_s`, from `first_step_timeout`). The bound is max(op_timeout_s, op_timeout_factor x
        expected_s): no call of a step waits for longer than the whole step takes, since every step
        ends in a barrier of all members (`Comm.commit`), so a node's own step time measures the
        slowest member's work and every wait in it. Nodes compute it locally and need not agree: a
        node that gives up first closes its groups and poisons what it owes, which fails every
        peer's pending call at once, and the commit protocol (not the bound) decides what step
        counts; a bound too short costs a needless regroup, never the math."""
        if expected_s is None:
            return max(self.op_timeout_s, first_s)
        return max(self.op_timeout_s, self.op_timeout_factor * expected_s)

    @property
    def tokens_per_sample(self) -> int | None:
        """Tokens in one sample when the samples are token windows (a tokenized source, token ids,
        or the built-in GPT's synthetic tokens): `model.seq_len`; None for other data (a `py`
        dataset, the MLP), whose throughput is counted in samples."""
        windows = _token_windows(self) or (not self.data.source and self.model.kind == "gpt")
        return self.model.seq_len if windows and self.model.seq_len > 0 else None

    def validation_due(self, done: int) -> bool:
        """Whether the parameters after `done` steps get a validation pass: every `val_every` steps
        and after the last one."""
        return self.val_every > 0 and done > 0 and (done % self.val_every == 0 or done == self.steps)

    def problems(self) -> list[LayoutError]:
        """Every reason this config cannot run, each naming its field (empty when it can)."""
        found = self.model.problems() + self.data.problems()
        for check in (_shape_problems, _training_problems, _delivery_problems, _timing_problems):
            found += check(self)
        return found

    def validate(self) -> None:
        """Raise `LayoutError` naming the bad value and what was expected (`LayoutErrors` with every
        problem when there are several); no process is started."""
        _raise(self.problems())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (inverse of `from_dict`); the model with its kind's fields only."""
        out = dataclasses.asdict(self)
        out["model"] = self.model.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        """Build from `to_dict` output (or a job file's / request's contract): nested specs become
        dataclasses. Raises `LayoutError` naming the field for an unknown field or a value of the
        wrong type (a string, a bool or NaN where a number is expected), before `validate`."""
        return _build(cls, data, prefix="")


_SHA256 = r"[0-9a-f]{64}"


class _Problems(list):
    """The `LayoutError`s a check finds, in the order it finds them."""

    def bad(self, message: str, field: str) -> None:
        self.append(LayoutError(message, field=field))


def _shape_problems(config: JobConfig) -> list[LayoutError]:
    """The strategy, the schedule and the layout against the model and the batch."""
    found = _Problems()
    if config.strategy not in STRATEGIES:
        found.bad(f"strategy {config.strategy!r} is unknown; expected one of {STRATEGIES}", "strategy")
    if config.schedule not in SCHEDULES:
        found.bad(f"schedule {config.schedule!r} is unknown; expected one of {SCHEDULES}", "schedule")
    for name in ("dp", "pp", "microbatches"):
        if getattr(config, name) < 1:
            found.bad(f"{name}={getattr(config, name)} must be at least 1", name)
    known = config.model.num_layers > 0  # a user's model not validated yet: its layers are unknown
    stages = config.model.max_stages
    if known and config.pp > stages and config.model.kind == USER_MODEL_KIND:
        held = "" if stages == config.model.num_layers else f", {stages} of them with parameters"
        found.bad(f"pp={config.pp} stages but the model function {config.model.path} returns only "
                  f"{config.model.num_layers} layers{held}; expected pp <= {stages} (a layer without parameters "
                  "joins a neighbour's stage)", "pp")
    elif known and config.pp > config.model.num_layers:
        found.bad(f"pp={config.pp} stages but the model has only {config.model.num_layers} layers "
                  f"(n_layer={config.model.n_layer} + input + head); expected pp <= {config.model.num_layers}", "pp")
    if config.global_batch < 1:
        found.bad(f"global_batch={config.global_batch} must be at least 1", "global_batch")
    elif config.global_batch > MAX_GLOBAL_BATCH:
        found.bad(f"global_batch={config.global_batch} is too large; expected at most {MAX_GLOBAL_BATCH} samples a "
                  "step (the samples a job counts must fit a 64-bit integer)", "global_batch")
    elif config.num_microbatches >= 1 and config.global_batch % config.num_microbatches:
        found.bad(f"global_batch={config.global_batch} is not divisible by dp*microbatches={config.num_microbatches}; "
                  f"expected a multiple of {config.num_microbatches}", "global_batch")
    if known and config.layer_costs is not None and len(config.layer_costs) != config.model.num_layers:
        found.bad(f"layer_costs has {len(config.layer_costs)} entries; expected {config.model.num_layers} "
                  "(one per layer)", "layer_costs")
    if not 1 <= config.min_stages <= max(config.pp, 1):
        found.bad(f"min_stages={config.min_stages} must be between 1 and pp={config.pp}", "min_stages")
    return found


def _training_problems(config: JobConfig) -> list[LayoutError]:
    """Steps, validation, tokens, the starting weights, the optimizer, precision and the learning rate."""
    found = _Problems()
    if config.steps < 0:
        found.bad(f"steps={config.steps} must be >= 0", "steps")
    elif 1 <= config.global_batch <= MAX_GLOBAL_BATCH and config.steps * config.global_batch > MAX_SAMPLES:
        found.bad(f"steps={config.steps} x global_batch={config.global_batch} samples is more than the "
                  f"{MAX_SAMPLES} a job can count; expected fewer steps", "steps")
    if config.val_every < 0:
        found.bad(f"val_every={config.val_every} must be >= 0 (0: no validation)", "val_every")
    if config.val_every and not config.data.source:
        found.bad("val_every needs held-out data: set data.source (synthetic data has no validation split)",
                  "val_every")
    if config.data.tokenized and config.model.kind in ("gpt", USER_MODEL_KIND) and config.data.tokenizer == "byte" \
            and 0 < config.model.vocab_size < BYTE_VOCAB_SIZE:
        found.bad(f"model.vocab_size={config.model.vocab_size} is below the byte tokenizer's {BYTE_VOCAB_SIZE} ids; "
                  f"expected at least {BYTE_VOCAB_SIZE}", "model.vocab_size")
    if config.model.kind == USER_MODEL_KIND and config.model.layers:  # validated: its declaration is recorded
        for problem in undeclared_context(config):
            found.bad(problem.message, problem.field)
    if config.init_from and (not config.init_from.strip() or config.init_from != config.init_from.strip()
                           or (config.init_from.startswith("s3://") and len(config.init_from) <= 5)):
        found.bad(f"init_from={config.init_from!r} is not a path; expected a weights folder (model*.safetensors) "
                  "or s3://bucket/prefix, or empty for a seeded start", "init_from")
    if config.weight_decay_min_dim < 0:
        found.bad(f"weight_decay_min_dim={config.weight_decay_min_dim} must be >= 0 (0: decay every parameter)",
                  "weight_decay_min_dim")
    if not config.weight_decay >= 0:
        found.bad(f"weight_decay={config.weight_decay} must be >= 0", "weight_decay")
    if len(config.betas) != 2 or not all(0 <= b < 1 for b in config.betas):
        found.bad(f"betas={config.betas} is invalid; expected two numbers [beta1, beta2], each in [0, 1)", "betas")
    if not config.eps > 0:
        found.bad(f"eps={config.eps} must be > 0", "eps")
    if config.precision not in PRECISIONS:
        found.bad(f"precision {config.precision!r} is unknown; expected one of {PRECISIONS}", "precision")
    if not (config.loss_scale_init >= 1 and math.isfinite(config.loss_scale_init)
            and math.frexp(config.loss_scale_init)[0] == 0.5):
        found.bad(f"loss_scale_init={config.loss_scale_init} must be a power of two >= 1 (scaling by it is exact)",
                  "loss_scale_init")
    if config.loss_scale_growth_interval < 1:
        found.bad(f"loss_scale_growth_interval={config.loss_scale_growth_interval} must be >= 1",
                  "loss_scale_growth_interval")
    if config.device not in DEVICES:
        found.bad(f"device {config.device!r} is unknown; expected one of {DEVICES} (a node picks its own GPU "
                  "for cuda)", "device")
    if config.lr_schedule not in LR_SCHEDULES:
        found.bad(f"lr_schedule {config.lr_schedule!r} is unknown; expected one of {LR_SCHEDULES}", "lr_schedule")
    if config.warmup_steps < 0:
        found.bad(f"warmup_steps={config.warmup_steps} must be >= 0 (0: no warmup)", "warmup_steps")
    if not 0 <= config.lr_min <= config.lr:
        found.bad(f"lr_min={config.lr_min} must be between 0 and lr={config.lr}", "lr_min")
    if not config.clip >= 0:
        found.bad(f"clip={config.clip} must be >= 0 (0: no clipping)", "clip")
    return found


def _delivery_problems(config: JobConfig) -> list[LayoutError]:
    """What a node installs (requirements) and what the job writes out (export)."""
    found = _Problems()
    if len(config.requirements) > REQUIREMENTS_MAX:
        found.bad(f"requirements has {len(config.requirements)} entries; expected at most {REQUIREMENTS_MAX}",
                  "requirements")
    for index, entry in enumerate(config.requirements):
        problem = requirement_problem(entry)
        if problem:
            found.bad(f"requirements[{index}] {entry[:80]!r} {problem}", f"requirements[{index}]")
    if config.export not in ("", *EXPORT_FORMATS):
        found.bad(f"export={config.export!r} is unknown; expected one of {', '.join(EXPORT_FORMATS)} (or none)",
                  "export")
    elif config.export == "hf" and config.model.kind != "gpt":
        found.bad(f"export = 'hf' writes a Hugging Face GPT-2 folder, for the gpt presets; the model is "
                  f"{config.model.kind!r} (a model function's weights load into your own nn.Sequential with "
                  "load_state_dict(strict=True): docs/runtime.md)", "export")
    if config.export_shard_bytes < 1:
        found.bad(f"export_shard_bytes={config.export_shard_bytes} must be at least 1", "export_shard_bytes")
    return found


def _timing_problems(config: JobConfig) -> list[LayoutError]:
    """Timeouts, checkpointing and the rates the runtime estimates from."""
    found = _Problems()
    if not config.op_timeout_s > 0:  # `not >` also rejects NaN
        found.bad(f"op_timeout_s={config.op_timeout_s} must be a positive number of seconds", "op_timeout_s")
    if not (config.transfer_timeout_s == 0 or config.op_timeout_s <= config.transfer_timeout_s < math.inf):
        found.bad(f"transfer_timeout_s={config.transfer_timeout_s} is invalid; expected 0 (derive it from the bytes "
                  f"moved) or a finite number of seconds at least op_timeout_s={config.op_timeout_s}",
                  "transfer_timeout_s")
    if not 1 <= config.op_timeout_factor < math.inf:
        found.bad(f"op_timeout_factor={config.op_timeout_factor} must be a finite number at least 1 (the bound "
                  "of a call is this many times the expected step time)", "op_timeout_factor")
    if not (config.first_step_timeout_s == 0 or config.op_timeout_s <= config.first_step_timeout_s < math.inf):
        found.bad(f"first_step_timeout_s={config.first_step_timeout_s} is invalid; expected 0 (derive it from the "
                  f"model's work) or a finite number of seconds at least op_timeout_s={config.op_timeout_s}",
                  "first_step_timeout_s")
    if config.checkpoint_interval < 0:
        found.bad(f"checkpoint_interval={config.checkpoint_interval} must be >= 0 (0: from Young/Daly)",
                  "checkpoint_interval")
    if not 0 < config.mtbf_s < math.inf:  # `not <` also rejects NaN
        found.bad(f"mtbf_s={config.mtbf_s} must be a positive, finite number of seconds", "mtbf_s")
    if not 0 <= config.checkpoint_cost_s < math.inf:
        found.bad(f"checkpoint_cost_s={config.checkpoint_cost_s} must be a finite number of seconds >= 0",
                  "checkpoint_cost_s")
    if not 0 <= config.join_batch_wait_s < math.inf:
        found.bad(f"join_batch_wait_s={config.join_batch_wait_s} must be a finite number of seconds >= 0 "
                  "(0: regroup for every joiner at once)", "join_batch_wait_s")
    if not 0 < config.step_time_s < math.inf:
        found.bad(f"step_time_s={config.step_time_s} must be a positive, finite number of seconds", "step_time_s")
    if not 0 < config.compute_floor_gflop_s < math.inf:
        found.bad(f"compute_floor_gflop_s={config.compute_floor_gflop_s} must be a positive, finite rate in GFLOP/s",
                  "compute_floor_gflop_s")
    if not 0 <= config.link_gbps < math.inf:
        found.bad(f"link_gbps={config.link_gbps} must be a finite bandwidth in Gbit/s >= 0 (0: spill scores compute "
                  "only)", "link_gbps")
    if not 0 < config.transfer_floor_mb_s < math.inf:
        found.bad(f"transfer_floor_mb_s={config.transfer_floor_mb_s} must be a positive, finite bandwidth in MB/s",
                  "transfer_floor_mb_s")
    return found


def requirement_problem(entry: str) -> str:
    """Why `entry` is not an acceptable `requirements` entry (empty when it is). Entries are handed to
    pip one argument each, so anything pip could read as an option (`-e`, `--index-url`, `-r`) or
    that is not one plain requirement is refused here, before a node sees it."""
    from packaging.requirements import InvalidRequirement, Requirement

    expected = ("expected a requirement (name[extras] version, e.g. 'mypkg==1.2'), an "
                f"s3://bucket/key{'|'.join(PACKAGE_SUFFIXES)} file or upload:<sha256>")
    if not isinstance(entry, str) or not entry.strip():
        return f"is empty; {expected}"
    if len(entry) > REQUIREMENT_MAX_CHARS:
        return f"is {len(entry)} characters long; expected at most {REQUIREMENT_MAX_CHARS}"
    if entry.startswith("-"):
        return f"is a pip option; options are not accepted, {expected}"
    if entry.startswith(UPLOAD_PREFIX):
        if not re.fullmatch(_SHA256, entry.removeprefix(UPLOAD_PREFIX)):
            return "is not upload:<sha256> (64 lowercase hex digits, as POST /api/v1/packages/ answers)"
        return ""
    if entry.startswith("s3://"):
        bucket, _, key = entry[5:].partition("/")
        if not bucket or not key or re.search(r"\s", entry) or not key.endswith(PACKAGE_SUFFIXES):
            return f"is not an s3://bucket/key URL of a package file ({', '.join(PACKAGE_SUFFIXES)})"
        return ""
    if entry != entry.strip() or re.search(r"[^\S ]", entry):
        # Each entry is one pip argument; plain spaces inside one (`numpy >= 2`, a marker) are
        # PEP 508's, anything else (a newline, a tab, a leading space) has no business there.
        return f"has leading/trailing whitespace or a newline/tab; {expected}"
    try:
        requirement = Requirement(entry)
    except InvalidRequirement as exc:
        return f"is not a valid requirement ({str(exc).splitlines()[0]}); {expected}"
    if requirement.url:
        return f"names a URL; {expected} (upload the file, or put it in S3)"
    return ""


def plan_fields_problem(plan: dict[str, Any]) -> LayoutError | None:
    """A plan's first field that is not one of PLAN_FIELDS (a typo such as `ppp` would otherwise
    plan dp=1 x pp=1), or None."""
    unknown = sorted(set(plan) - set(PLAN_FIELDS), key=str)
    if not unknown:
        return None
    return LayoutError(f"unknown plan field(s) {', '.join(map(str, unknown))}; expected some of "
                       f"{list(PLAN_FIELDS)}"[:300], field=f"plan.{unknown[0]}")


def plan_nodes_problem(nodes: int, *, dp: int, pp: int) -> LayoutError | None:
    """`plan.nodes` fewer than the dp x pp workers it must hold, or None."""
    if nodes >= dp * pp:
        return None
    return LayoutError(f"plan.nodes={nodes} cannot hold dp={dp} x pp={pp} = {dp * pp} workers", field="plan.nodes")


def _type_error(path: str, expected: str, value: Any) -> LayoutError:
    return LayoutError(f"{path} must be {expected}, got {value!r}", field=path)


def _check_value(path: str, annotation: str, value: Any) -> Any:
    """`value` checked against a field's annotation (the module's annotations are strings)."""
    optional = annotation.endswith("| None")
    if value is None:
        if optional:
            return None
        raise _type_error(path, "given (not null)", value)
    base = annotation.removesuffix(" | None")
    if base == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise _type_error(path, "an integer", value)
        if abs(value) > 2**53:
            raise _type_error(path, "an integer of at most 2**53", value)
    elif base == "float":
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise _type_error(path, "a finite number", value)
        value = float(value)
    elif base == "bool":
        if not isinstance(value, bool):
            raise _type_error(path, "true or false", value)
    elif base == "str":
        if not isinstance(value, str):
            raise _type_error(path, "a string", value)
        if len(value) > 1000 or unstorable(value):
            raise _type_error(path, "a string of at most 1,000 characters without NUL or lone surrogates", value[:40])
    elif base == "dict[str, Any]":
        if not isinstance(value, dict):
            raise _type_error(path, "a JSON object", value)
        _check_json(path, value, depth=0)
        try:
            size = len(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise _type_error(path, f"a JSON object ({exc})", value) from None
        if size > ARGS_MAX_BYTES:
            raise LayoutError(f"{path} is {size:,} bytes as JSON; expected at most {ARGS_MAX_BYTES:,}", field=path)
        value = json.loads(json.dumps(value))  # a copy the caller cannot change under us
    elif base == "list[str]":
        if not isinstance(value, list) or len(value) > 100_000:
            raise _type_error(path, "a list of strings", value)
        value = [_check_value(f"{path}[{i}]", "str", v) for i, v in enumerate(value)]
    elif base == "list[LayerMeasure]":
        if not isinstance(value, list) or len(value) > 100_000:
            raise _type_error(path, "a list of per-layer measures (objects)", value)
        value = [_build(LayerMeasure, v, prefix=f"{path}[{i}].") for i, v in enumerate(value)]
    elif base == "list[float]":
        if not isinstance(value, list) or len(value) > 100_000:
            raise _type_error(path, "a list of numbers", value)
        value = [_check_value(f"{path}[{i}]", "float", v) for i, v in enumerate(value)]
    return value


def _check_json(path: str, value: Any, *, depth: int) -> None:
    """`value` is plain JSON (objects with string keys, lists, strings, finite numbers, booleans,
    null) nested at most `ARGS_MAX_DEPTH` deep; raises `LayoutError` naming `path`."""
    if depth > ARGS_MAX_DEPTH:
        raise LayoutError(f"{path} is nested more than {ARGS_MAX_DEPTH} levels deep; expected a flatter object",
                          field=path)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or unstorable(key):
                raise _type_error(path, "an object with string keys (no NUL or lone surrogate)", key)
            _check_json(f"{path}.{key}", item, depth=depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(f"{path}[{i}]", item, depth=depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise _type_error(path, "a finite number", value)
    elif isinstance(value, str) and unstorable(value):
        raise _type_error(path, f"a string without {unstorable(value)}", value[:40])
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise _type_error(path, "JSON (an object, list, string, number, true/false or null)", value)


def undeclared_context(config: JobConfig) -> list[LayoutError]:
    """What a user's model trained on token windows has not declared: its context (`model.seq_len`,
    the windows' length) and its vocabulary (`model.vocab_size`). Never a silent default."""
    model = config.model
    if model.kind != USER_MODEL_KIND or not _token_windows(config):
        return []
    found = []
    how = ("expected it declared by the model function (return spotpipe.Model(layers, seq_len=..., vocab_size=...)) "
           "or set: spotpipe train --seq-len N / --vocab-size N, or [config.model] seq_len / vocab_size")
    if model.seq_len < 1:
        found.append(LayoutError(f"model.seq_len is not declared for {model.path}, and the data ({config.data.source}) "
                                 f"are token windows of that length; {how}", field="model.seq_len"))
    if model.vocab_size < 1:
        found.append(LayoutError(f"model.vocab_size is not declared for {model.path}, and the data "
                                 f"({config.data.source}) are token ids below it; {how}", field="model.vocab_size"))
    return found


def _token_windows(config: JobConfig) -> bool:
    """The samples are token windows: a tokenized source or token ids."""
    return config.data.source.partition(":")[0] in TOKEN_WINDOW_FORMATS


_NESTED: dict[str, type] = {}  # annotation name -> dataclass, filled below


def _build(cls: type, data: Any, *, prefix: str) -> Any:
    """`cls(**data)` with every field checked; errors name the field's dotted path."""
    if not isinstance(data, dict):
        raise _type_error(prefix.rstrip(".") or "config", "an object", data)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise LayoutError(
            f"unknown field(s) {', '.join(prefix + str(u) for u in unknown)}; expected some of {sorted(fields)}",
            field=prefix + str(unknown[0]),
        )
    values, problems = {}, []
    for name, value in data.items():
        annotation = str(fields[name].type)
        nested = _NESTED.get(annotation.removesuffix(" | None"))
        try:
            if nested is not None and value is not None:
                values[name] = _build(nested, value, prefix=f"{prefix}{name}.")
            else:
                values[name] = _check_value(prefix + name, annotation, value)
        except LayoutError as exc:
            problems.extend(each_error(exc))
    _raise(problems)
    return cls(**values)


_NESTED.update({"ModelSpec": ModelSpec, "DeviceTime": DeviceTime, "DataSpec": DataSpec})


def build_job_config(contract: dict[str, Any], **layout: Any) -> JobConfig:
    """The runtime's JobConfig of a job's `contract` (JobConfig fields but the layout) with the
    plan's `layout` (dp, pp, microbatches, strategy, steps, and the schedule the planner chose), validated.
    The one path from a job (API request, job file, dashboard form) to what the runtime runs;
    raises `LayoutError`/`LayoutErrors` naming each field."""
    _raise([LayoutError(f"config.{k} is set by the job's plan, strategy and target steps", field=f"config.{k}")
            for k in LAYOUT_FIELDS if k in contract])
    config = JobConfig.from_dict({**contract, **layout})
    config.validate()
    return config


def explicit_layout(
    *, dp: Any, pp: Any, microbatches: Any = None, total_microbatches: int | None = None,
) -> dict[str, int]:
    """The layout fields of a plan the user wrote (`plan.dp`, `plan.pp`, `plan.microbatches`), or
    micro-batches from the legacy body's count per step over all pipelines. Raises `LayoutError`."""
    layout = {}
    for name, value in (("dp", dp), ("pp", pp), ("microbatches", microbatches)):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LayoutError(f"plan.{name} must be a positive integer, got {value!r}", field=f"plan.{name}")
        layout[name] = value
    if "microbatches" not in layout and total_microbatches is not None:
        if total_microbatches % layout.get("dp", 1):
            raise LayoutError(f"model_spec.micro_batches={total_microbatches} (per step) is not divisible by "
                              f"plan.dp={layout.get('dp', 1)}", field="model_spec.micro_batches")
        layout["microbatches"] = total_microbatches // layout.get("dp", 1)
    return layout


# --- The legacy `model_spec` request body ------------------------------------------------------------

MODEL_SPEC_ALIASES = {
    "kind": "kind", "layers": "n_layer", "d_model": "n_embd", "heads": "n_head", "seq_len": "seq_len",
    "vocab": "vocab_size", "in_features": "in_features",
}
"""`model_spec` names (the API's first request body, still accepted) -> `ModelSpec` fields."""


def contract_from_model_spec(spec: Any) -> tuple[dict[str, Any], int | None]:
    """The contract fields (`model`, `global_batch`) of a legacy `model_spec` body, and its
    `micro_batches` (micro-batches per step over all pipelines, None when absent): the one place the
    old names are translated. Raises `LayoutError` naming `model_spec.<old name>`."""
    if not isinstance(spec, dict):
        raise _type_error("model_spec", "an object", spec)
    unknown = sorted(set(spec) - set(MODEL_SPEC_ALIASES) - {"global_batch", "micro_batches"})
    if unknown:
        raise LayoutError(
            f"unknown field(s) {', '.join('model_spec.' + str(u) for u in unknown)}; expected some of "
            f"{sorted([*MODEL_SPEC_ALIASES, 'global_batch', 'micro_batches'])}",
            field=f"model_spec.{unknown[0]}",
        )
    model = {MODEL_SPEC_ALIASES[k]: v for k, v in spec.items() if k in MODEL_SPEC_ALIASES}
    contract: dict[str, Any] = {"model": model}
    if "global_batch" in spec:
        contract["global_batch"] = spec["global_batch"]
    total = spec.get("micro_batches")
    if total is not None:
        _check_value("model_spec.micro_batches", "int", total)
        if total < 1:
            raise LayoutError(f"model_spec.micro_batches={total} must be at least 1", field="model_spec.micro_batches")
    return contract, total


def alias_field(field_path: str) -> str:
    """The `model_spec.<old name>` of a contract field, for errors about a request in the old form."""
    if field_path == "global_batch":
        return "model_spec.global_batch"
    if field_path.startswith("model."):
        name = field_path.removeprefix("model.")
        old = next((k for k, v in MODEL_SPEC_ALIASES.items() if v == name), name)
        return f"model_spec.{old}"
    return field_path


def model_spec_view(config: dict[str, Any]) -> dict[str, Any]:
    """A stored contract in the legacy `model_spec` shape, for clients that still read it."""
    model = config.get("model") or {}
    view = {old: model[new] for old, new in MODEL_SPEC_ALIASES.items() if new in model}
    view["global_batch"] = config.get("global_batch")
    view["micro_batches"] = int(config.get("dp", 1)) * int(config.get("microbatches", 1))
    return view
