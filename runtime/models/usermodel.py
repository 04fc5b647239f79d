"""A user's model (`ModelSpec(kind="py", path="package.module:function", args={...})`): building its
layers the same on every rank, its loss, the shapes its stage boundaries send, and the checks of the
model alone that run before a fleet is bought (`check_layers`; `runtime.train.model_check` adds those
on the job's data).

The model function is called with `args` as keyword arguments and returns one of:

- an `nn.Sequential` or a list of `nn.Module` layers: built whole on each rank, under
  `torch.manual_seed(seed)`, and the rank keeps the layers it holds (fine for a model that fits one node);
- a list of zero-argument layer factories (as DeepSpeed's `LayerSpec`): the function itself builds no
  parameters; layer `i` is built alone with torch's generator seeded from (seed, i), the rule of the
  built-in models, so a rank builds only the layers it holds.

Either way a layer rebuilt on a survivor or a replacement equals the original. The control plane never
imports this module's callers' code: only clients (`spotpipe train`, `spotpipe submit`) and nodes do.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runtime.config import (
    USER_MODEL_KIND,
    JobConfig,
    LayerMeasure,
    LayoutError,
    LayoutErrors,
    ModelSpec,
    undeclared_context,
)
from runtime.models.declaration import DECLARED_FIELDS, Model

EXPECTED_RETURN = ("an nn.Sequential, a list of nn.Module layers, or a list of zero-argument layer factories "
                   "(callables returning an nn.Module), or spotpipe.Model(one of those, seq_len=..., "
                   "vocab_size=...)")


class ModelError(LayoutError):
    """A user's model that cannot train; the message names what is wrong and what was expected."""

    def __init__(self, message: str, *, field: str = "model.path") -> None:
        super().__init__(message, field=field)


def layer_seed(seed: int, index: int) -> int:
    """The seed of layer `index`'s initialisation (the built-in models' rule too)."""
    return seed * 100_003 + index


def load_function(location: str, *, what: str = "model function", field: str = "model.path") -> Callable:
    """The callable at `package.module:function`; raises `ModelError` with the import error."""
    module_name, _, name = location.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # anything the module raises at import time is the user's to see
        raise ModelError(f"{field} {location!r}: importing {module_name!r} failed ({type(exc).__name__}: {exc}); "
                         "expected a module importable here and on every node (installed or on PYTHONPATH; for "
                         "spotpipe here, also a .py file in the folder it runs from)",
                         field=field) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ModelError(f"{field} {location!r}: module {module_name!r} has no {what} {name!r}; "
                         f"expected a callable named {name!r} in it", field=field)
    return function


class _Seeded:
    """Torch's global generator set to `seed` inside, restored after (so callers' draws are unaffected)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self.state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.random.set_rng_state(self.state)


@dataclass(slots=True)
class _Built:
    """What the model function returned: whole layers or factories."""

    layers: list[nn.Module] | None = None
    factories: list[Callable[[], nn.Module]] | None = None
    declared: dict[str, Any] = field(default_factory=dict)
    """What it declared with `spotpipe.Model` (seq_len, vocab_size, language_model)."""

    def __len__(self) -> int:
        return len(self.layers if self.layers is not None else self.factories)


def _call(spec: ModelSpec, seed: int) -> _Built:
    """Call the model function (under the job's seed) and classify what it returned."""
    function = load_function(spec.path)
    try:
        with _Seeded(seed):
            returned = function(**spec.args)
    except Exception as exc:
        raise ModelError(f"model function {spec.path}(**{json.dumps(spec.args)}) raised "
                         f"{type(exc).__name__}: {exc}; expected it to return {EXPECTED_RETURN}") from None
    declared = {}
    if isinstance(returned, Model):
        declared, returned = returned.declared(), returned.layers
    if isinstance(returned, nn.Sequential):
        return _Built(layers=list(returned), declared=declared)
    if isinstance(returned, list | tuple) and returned:
        if all(isinstance(item, nn.Module) for item in returned):
            return _Built(layers=list(returned), declared=declared)
        if all(callable(item) and not isinstance(item, nn.Module) for item in returned):
            return _Built(factories=list(returned), declared=declared)
        kinds = sorted({type(item).__name__ for item in returned})
        raise ModelError(f"model function {spec.path} returned a list of {', '.join(kinds)}; "
                         f"expected {EXPECTED_RETURN}, not a mix")
    what = "an empty list" if isinstance(returned, list | tuple) else type(returned).__name__
    raise ModelError(f"model function {spec.path} returned {what}; expected {EXPECTED_RETURN}")


def _key(spec: ModelSpec, seed: int) -> tuple:
    return (spec.path, json.dumps(spec.args, sort_keys=True), seed, str(torch.get_default_device()))


_BUILT: dict[tuple, _Built] = {}
"""Per process: the model function's result, pristine (callers get copies), by (model, seed, device)."""


def _built(spec: ModelSpec, seed: int) -> _Built:
    key = _key(spec, seed)
    if key not in _BUILT:
        _BUILT[key] = _call(spec, seed)
    return _BUILT[key]


def _from_factory(spec: ModelSpec, built: _Built, index: int, seed: int) -> nn.Module:
    factory = built.factories[index]
    try:
        with _Seeded(layer_seed(seed, index)):
            layer = factory()
    except Exception as exc:
        raise ModelError(f"layer factory {index} of {spec.path} raised {type(exc).__name__}: {exc}; "
                         "expected it to build the layer") from None
    if not isinstance(layer, nn.Module):
        raise ModelError(f"layer factory {index} of {spec.path} returned {type(layer).__name__}; "
                         "expected an nn.Module")
    return layer


def build_user_layer(spec: ModelSpec, index: int, seed: int) -> nn.Module:
    """Layer `index` of a user's model, initialised the same on every rank (see the module docstring)."""
    built = _built(spec, seed)
    if not 0 <= index < len(built):
        raise IndexError(f"layer {index} out of range; the model has {len(built)} layers")
    if built.factories is not None:
        return _from_factory(spec, built, index, seed)
    return copy.deepcopy(built.layers[index])


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the last dimension (the default loss)."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def loss_for(spec: ModelSpec) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of a job: the user's `model.loss` function, else cross-entropy."""
    if spec.kind == USER_MODEL_KIND and spec.loss:
        return load_function(spec.loss, what="loss function", field="model.loss")
    return cross_entropy


# -- shapes of the stage boundaries ----------------------------------------------------------------

Boundary = tuple[tuple[int, ...], torch.dtype]
_SHAPES: dict[tuple, list[Boundary]] = {}


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} ({str(value.dtype).removeprefix('torch.')})"
    return f"a {type(value).__name__}"


def _layer_name(layers: list[nn.Module], index: int) -> str:
    return f"layer {index} ({type(layers[index]).__name__})"


def dry_forward(config: JobConfig, layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor | None = None,
                ) -> list[Boundary]:
    """Forward `x` through `layers` (built on the meta device: no memory, no compute); returns the
    (shape, dtype) entering each layer, index 0 being the data. Raises `ModelError` naming the layer
    whose output cannot feed the next one, or the loss that cannot take the last output."""
    shapes: list[Boundary] = [(tuple(x.shape), x.dtype)]
    out = x.to("meta")
    for i, layer in enumerate(layers):
        try:
            out = layer(out)
        except Exception as exc:
            feeds = "the data's input" if i == 0 else f"the output of {_layer_name(layers, i - 1)}"
            raise ModelError(f"{_layer_name(layers, i)} cannot take {feeds}, {_describe(out)}: "
                             f"{type(exc).__name__}: {exc}; expected each layer's output to be a valid input "
                             "of the next") from None
        if i < len(layers) - 1:
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                raise ModelError(f"{_layer_name(layers, i)} returns {_describe(out)}; expected one floating-point "
                                 "tensor between layers (what a stage sends to the next and differentiates)")
            shapes.append((tuple(out.shape), out.dtype))
    if y is not None and config.model.kind == USER_MODEL_KIND:
        _check_output_width(config, layers, out, y)
        loss = loss_for(config.model)
        try:
            value = loss(out, y.to("meta"))
        except Exception as exc:
            raise ModelError(f"the loss ({config.model.loss or 'cross-entropy'}) cannot take the last layer's output, "
                             f"{_describe(out)}, with targets {_describe(y)}: {type(exc).__name__}: {exc}; expected "
                             "loss(output, target) -> a scalar tensor", field="model.loss") from None
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ModelError(f"the loss ({config.model.loss or 'cross-entropy'}) returns {_describe(value)}; "
                             "expected a scalar tensor", field="model.loss")
    return shapes


def _check_output_width(config: JobConfig, layers: list[nn.Module], out: Any, y: torch.Tensor) -> None:
    """The default cross-entropy takes the targets as indices into the last layer's output, which
    the meta device does not bound-check: a language model's last layer must be `vocab_size` wide,
    and any model's wider than its largest target (else every rank fails at its first step)."""
    if config.model.loss or not isinstance(out, torch.Tensor) or y.is_floating_point() or not out.dim():
        return
    width, spec, last = out.shape[-1], config.model, _layer_name(layers, len(layers) - 1)
    if spec.is_language_model and spec.vocab_size and width != spec.vocab_size:
        raise ModelError(f"model function {spec.path}: its last layer, {last}, outputs {width} values per position, "
                         f"but the model's vocab_size is {spec.vocab_size}; expected logits over the vocabulary: a "
                         f"last layer {spec.vocab_size} wide", field="model.vocab_size")
    largest = int(y.max()) if y.numel() and not y.is_meta else -1
    if largest >= width:
        raise ModelError(f"model function {spec.path}: its last layer, {last}, outputs {width} values in its last "
                         f"dimension, but the data's targets go up to {largest}; expected the cross-entropy's "
                         f"classes: a last layer at least {largest + 1} wide (or a loss of your own, model.loss)",
                         field="model.path")


def meta_layers(config: JobConfig) -> list[nn.Module]:
    """Every layer of the job's model on the meta device (shapes only)."""
    from runtime.models.model import build_layer

    with torch.device("meta"):
        return [build_layer(config.model, i, config.seed) for i in range(config.model.num_layers)]


def boundary_shapes(config: JobConfig, first_input: torch.Tensor) -> list[Boundary]:
    """(shape, dtype) of the activation entering each layer for a micro-batch whose input is shaped
    like `first_input` (index 0: the data itself): what stage boundaries send and receive."""
    key = (json.dumps(_spec_dict(config.model), sort_keys=True), config.seed, tuple(first_input.shape),
           str(first_input.dtype))
    if key not in _SHAPES:
        _SHAPES[key] = dry_forward(config, meta_layers(config), first_input)
    return _SHAPES[key]


def _spec_dict(spec: ModelSpec) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(spec)


# -- validation before the fleet -------------------------------------------------------------------


@dataclass(slots=True)
class ModelReport:
    """What validating a model found (recorded into the job's contract by `record`)."""

    num_layers: int
    """Layers the model function returns."""
    layer_costs: list[float] | None = None
    """Measured forward+backward seconds per layer on one micro-batch (None: not profiled)."""
    boundaries: list[Boundary] = field(default_factory=list)
    """(shape, dtype) entering each layer (index 0: the data)."""
    parameters: list[int] = field(default_factory=list)
    """Parameters per layer."""
    declared: dict[str, Any] = field(default_factory=dict)
    """What the model function declared (`spotpipe.Model`), already checked against the job's values."""
    measures: list[LayerMeasure] = field(default_factory=list)
    """Each layer for one sample (`LayerMeasure`); empty when the data could not be opened here."""

    def record(self, config: JobConfig) -> None:
        """Write `num_layers`, the declared context and vocabulary, the layers' measures and (unless
        the job set its own) the profiled costs into `config`."""
        config.model.layers = self.num_layers
        if self.measures:
            config.model.layer_measures = list(self.measures)
        for name, value in self.declared.items():
            setattr(config.model, name, value)
        if config.layer_costs is None and self.layer_costs is not None:
            config.layer_costs = list(self.layer_costs)


def _same_init(a: nn.Module, b: nn.Module) -> str | None:
    """The first parameter or buffer that differs between two builds, else None."""
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return f"its state dict keys ({sorted(sa)[:4]}...)"
    for name in sa:
        if sa[name].shape != sb[name].shape or not torch.equal(sa[name], sb[name]):
            return f"{name!r}"
    return None


def _check_declared(spec: ModelSpec, declared: dict[str, Any]) -> None:
    """A declared value must be of its type and, when the job sets the same field, equal to it."""
    for name in DECLARED_FIELDS:
        if name not in declared:
            continue
        value, kind = declared[name], bool if name == "language_model" else int
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 1)):
            raise ModelError(f"model function {spec.path} declares {name}={value!r}; expected "
                             + ("true or false" if kind is bool else "a positive integer"), field=f"model.{name}")
        set_here = getattr(spec, name)
        if set_here not in (None, 0) and set_here != value:
            raise ModelError(f"model.{name}={set_here!r} is set for the job, but the model function {spec.path} "
                             f"declares {name}={value!r}; expected one value (drop the job's, or change the "
                             "function's arguments)", field=f"model.{name}")


def apply_declaration(config: JobConfig) -> None:
    """Record what the model function declares (`spotpipe.Model`: context, vocabulary, whether it is a
    language model) into `config.model`, and refuse a job on token windows whose context or
    vocabulary is then still unknown: before its data are opened (their windows are `seq_len` long).
    Raises `ModelError`/`LayoutError` naming the field."""
    if config.model.kind != USER_MODEL_KIND:
        return
    declared = _built(config.model, config.seed).declared
    _check_declared(config.model, declared)
    for name, value in declared.items():
        setattr(config.model, name, value)
    problems = undeclared_context(config)
    if problems:
        raise problems[0] if len(problems) == 1 else LayoutErrors(problems)


def check_layers(config: JobConfig) -> tuple[ModelReport, list[nn.Module]]:
    """The checks of a user's model that need no data, before any process starts; raises `ModelError`
    with one message naming what is wrong and what was expected: not importable, wrong return type,
    fewer layers with parameters than pipeline stages (a layer without joins a neighbour's stage),
    non-deterministic initialisation. Returns the report so far (layer count, parameters per layer,
    what the function declares) and the layers, built under the job's seed. What needs a micro-batch
    of the job's data (the dry forward, the measures, the timing) is
    `runtime.train.model_check.validate_model`'s."""
    spec = config.model
    problems = spec.problems()
    if problems:
        raise problems[0]
    if spec.loss:
        load_function(spec.loss, what="loss function", field="model.loss")
    first = _call(spec, config.seed)
    count = len(first)
    _check_declared(spec, first.declared)
    if spec.layers and spec.layers != count:
        raise ModelError(f"model function {spec.path} returns {count} layers but the job's contract says "
                         f"model.layers={spec.layers}; expected the same model on every machine (same code and "
                         "args)", field="model.layers")
    if count < config.pp:
        raise ModelError(f"model function {spec.path} returns {count} layers, fewer than the pp={config.pp} "
                         f"pipeline stages; expected at least {config.pp} layers (or a smaller pp)", field="pp")
    second = _call(spec, config.seed)
    layers = []
    for i in range(count):
        if first.factories is not None:
            layer, again = (_from_factory(spec, first, i, config.seed), _from_factory(spec, second, i, config.seed))
        else:
            layer, again = first.layers[i], second.layers[i]
        layers.append(layer)
        differs = _same_init(layer, again)
        if differs is not None:
            how = (f"layer factory {i} run twice under torch.manual_seed({layer_seed(config.seed, i)})"
                   if first.factories is not None else f"the model function run twice under "
                   f"torch.manual_seed({config.seed})")
            raise ModelError(f"{_layer_name(layers, i)} is initialised non-deterministically: {how} gave different "
                             f"values of {differs}; expected initialisation from torch's global generator only "
                             "(no fresh torch.Generator, numpy or random draws), so every rank builds the same layer")
    report = ModelReport(num_layers=count, declared=dict(first.declared),
                         parameters=[sum(p.numel() for p in layer.parameters()) for layer in layers])
    held = sum(1 for p in report.parameters if p > 0)
    if not held:
        raise ModelError(f"model function {spec.path} returns {count} layers and none holds parameters; expected "
                         "at least one layer with parameters to train")
    if held < config.pp:
        raise ModelError(f"model function {spec.path} returns {count} layers of which {held} hold parameters, fewer "
                         f"than the pp={config.pp} pipeline stages (a layer without parameters joins a neighbour's "
                         f"stage); expected at least {config.pp} layers with parameters (or a smaller pp)", field="pp")
    return report, layers
