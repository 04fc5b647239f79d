"""The learned profile predictor: per-layer times for instance types (or models) never measured.

Each of forward, backward-input and backward-weight time is modelled as a roofline-style sum

    t = a * flops / peak_flops + b * bytes / memory_bandwidth + c * kernels

with non-negative coefficients fitted by least squares on *relative* error over every stored
measured profile (all layers, all devices). `a` is the inverse of the achieved fraction of peak,
`b` the same for memory traffic, `c` a per-kernel launch overhead (microseconds). Features of a layer (FLOPs, bytes)
come from running it once on the `meta` device, so any model size costs nothing to describe.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from runtime.config import USER_MODEL_KIND, ModelSpec
from runtime.planner.profile import DeviceSpec, LayerProfile, ModelProfile

DIRECTIONS = ("forward_s", "backward_input_s", "backward_weight_s")


@dataclass(frozen=True, slots=True)
class LayerFeatures:
    forward_flops: float
    param_bytes: float
    activation_bytes: float
    output_bytes: float
    has_input_grad: bool
    ops: int = 1
    """Kernels the forward launches (the per-op overhead term of small layers)."""


def layer_features(spec: ModelSpec, *, microbatch_size: int, dtype: str = "float32") -> list[LayerFeatures]:
    """FLOPs and bytes of every layer for one micro-batch, computed on the meta device (no compute)."""
    # Imported on first use: the control plane imports the planner in every web and worker process,
    # and only a plan that predicts needs torch (about 2 s and 200 MB to load).
    from runtime.planner.meta_features import meta_layer_features

    spec.validate()
    if spec.kind == USER_MODEL_KIND:
        return measured_layer_features(spec, microbatch_size=microbatch_size, dtype=dtype)
    items = ((k, json.dumps(v, sort_keys=True) if k == "args" else v)  # hashable; a built-in model has no measures
             for k, v in asdict(spec).items() if k != "layer_measures")
    return list(meta_layer_features(tuple(sorted(items)), microbatch_size, dtype))


ELEMENT_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


def measured_layer_features(spec: ModelSpec, *, microbatch_size: int, dtype: str = "float32") -> list[LayerFeatures]:
    """A user's model's features for one micro-batch, from its per-sample `layer_measures` (taken in
    float32 where its code is: the control plane never imports it). Raises ValueError when the model
    was never measured."""
    if not spec.layer_measures:
        raise ValueError(f"the model function {spec.path} has no model.layer_measures; the planner predicts "
                         "from them (spotpipe submit and spotpipe train record them)")
    scale = ELEMENT_BYTES[dtype] / ELEMENT_BYTES["float32"]
    return [
        LayerFeatures(forward_flops=m.fixed_forward_flops + m.forward_flops * microbatch_size,
                      param_bytes=m.parameters * ELEMENT_BYTES[dtype],
                      activation_bytes=(m.fixed_activation_bytes + m.activation_bytes * microbatch_size) * scale,
                      output_bytes=m.output_bytes * microbatch_size * scale, has_input_grad=m.input_grad,
                      ops=m.kernels)
        for m in spec.layer_measures
    ]


def _row(flops: float, nbytes: float, ops: int, device: DeviceSpec) -> list[float]:
    return [flops / (device.peak_tflops * 1e12), nbytes / (device.memory_bandwidth_gbs * 1e9), ops * 1e-6]


def _bytes(lay: LayerProfile | LayerFeatures) -> float:
    return lay.param_bytes + lay.activation_bytes + lay.output_bytes


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by active-set elimination (3 unknowns: brute force is exact)."""
    best, best_err = np.zeros(a.shape[1]), float("inf")
    n = a.shape[1]
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(n)
        full[cols] = coef
        err = float(np.sum((a @ full - b) ** 2))
        if err < best_err:
            best, best_err = full, err
    return best


@dataclass(slots=True)
class ProfilePredictor:
    """Fitted coefficients (a, b, c) per direction."""

    coefficients: dict[str, list[float]]
    samples: int = 0

    @classmethod
    def fit(cls, profiles: list[ModelProfile]) -> ProfilePredictor:
        """Fit on every layer of every measured profile (minimises relative error)."""
        coefs = {}
        samples = 0
        for direction in DIRECTIONS:
            rows, target = [], []
            for prof in profiles:
                if not prof.measured:
                    continue
                for lay in prof.layers:
                    t = getattr(lay, direction)
                    if t <= 0:
                        continue
                    r = _row(lay.forward_flops, _bytes(lay), lay.ops, prof.device)
                    rows.append([v / t for v in r])
                    target.append(1.0)
            if not rows:
                raise ValueError("no measured profile to fit the predictor on; profile at least one model first")
            samples = max(samples, len(rows))
            coefs[direction] = _nnls(np.array(rows), np.array(target)).tolist()
        return cls(coefficients=coefs, samples=samples)

    def layer_time(self, direction: str, flops: float, nbytes: float, ops: int, device: DeviceSpec) -> float:
        a, b, c = self.coefficients[direction]
        x = _row(flops, nbytes, ops, device)
        return a * x[0] + b * x[1] + c * x[2]

    def predict(self, spec: ModelSpec, *, microbatch_size: int, device: DeviceSpec, instance_type: str) -> ModelProfile:
        """A profile of `spec` on `device`, never measured there."""
        layers = []
        for feat in layer_features(spec, microbatch_size=microbatch_size, dtype=device.dtype):
            nbytes = _bytes(feat)
            times = {d: self.layer_time(d, feat.forward_flops, nbytes, feat.ops, device) for d in DIRECTIONS}
            if not feat.has_input_grad:
                times["backward_input_s"] = 0.0
            layers.append(
                LayerProfile(
                    forward_s=times["forward_s"],
                    backward_input_s=times["backward_input_s"],
                    backward_weight_s=times["backward_weight_s"],
                    forward_flops=feat.forward_flops,
                    param_bytes=feat.param_bytes,
                    activation_bytes=feat.activation_bytes,
                    output_bytes=feat.output_bytes,
                    ops=feat.ops,
                )
            )
        return ModelProfile(
            instance_type=instance_type,
            device=device,
            model=asdict(spec),
            microbatch_size=microbatch_size,
            layers=layers,
            measured=False,
            meta={"predictor": self.coefficients},
        )


DEFAULT_COEFFICIENTS = {
    # Fitted on this project's CPU profiles (bench/planner.py prints a fresh fit); used when no
    # profile is stored: roughly "forward reaches 1/a of peak, each backward half a forward".
    "forward_s": [2.5, 0.0, 3.0],
    "backward_input_s": [2.7, 0.0, 3.0],
    "backward_weight_s": [3.6, 0.0, 4.0],
}


def default_predictor() -> ProfilePredictor:
    """A predictor with shipped coefficients, for planning before anything was profiled."""
    return ProfilePredictor(coefficients={k: list(v) for k, v in DEFAULT_COEFFICIENTS.items()})
