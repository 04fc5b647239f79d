"""Profiler: per-layer forward, backward-input and backward-weight time, activation and parameter
memory and FLOPs of a `runtime.models.model` model on the current device, stored per instance type.

Times are minima over `repeats` runs after a warm-up (the minimum is the least disturbed by other
processes on a shared machine), for one micro-batch of `microbatch_size`
samples. Backward-input is the gradient with respect to the layer's input only, backward-weight the
gradient with respect to its parameters only (what the `fiw` schedule runs as I and W).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runtime.config import ModelSpec

# torch is imported inside the measuring functions: the control plane imports this module (profile
# records and their store) in every web and worker process, which should not load torch for that.

BYTES_PER_PARAM_TRAINING = 16
"""fp32 parameter + gradient + two AdamW moments."""


@dataclass(slots=True)
class LayerProfile:
    """One layer for one micro-batch."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    forward_flops: float
    """Floating-point operations of the forward (backward is about twice that)."""
    param_bytes: float
    """Bytes of the parameters alone (fp32)."""
    activation_bytes: float
    """Bytes the layer saves for its backward, per micro-batch."""
    output_bytes: float
    """Bytes of the layer's output (what a stage boundary after it sends)."""
    ops: int = 1
    """Kernels the forward launches."""


@dataclass(slots=True)
class DeviceSpec:
    """A device as the learned predictor sees it."""

    name: str
    peak_tflops: float
    memory_bandwidth_gbs: float
    network_gbps: float = 0.0
    dtype: str = "float32"
    """Element type the device computes in (`float64` on a CPU emulates a slower device)."""


@dataclass(slots=True)
class ModelProfile:
    """Per-layer profile of one model at one micro-batch size on one instance type."""

    instance_type: str
    device: DeviceSpec
    model: dict
    microbatch_size: int
    layers: list[LayerProfile]
    threads: int = 1
    measured: bool = True
    """False for a profile predicted by the learned model."""
    meta: dict = field(default_factory=dict)

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(**self.model)

    def fiw(self) -> list[tuple[float, float, float]]:
        """(forward, backward-input, backward-weight) seconds per layer, as `runtime.parallel.schedule` takes them."""
        return [(lay.forward_s, lay.backward_input_s, lay.backward_weight_s) for lay in self.layers]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelProfile:
        d = dict(d)
        d["device"] = DeviceSpec(**d["device"])
        d["layers"] = [LayerProfile(**lay) for lay in d["layers"]]
        return cls(**d)


def model_key(spec: ModelSpec, microbatch_size: int) -> str:
    """Stable file name of a (model, micro-batch size) pair."""
    blob = json.dumps({"model": asdict(spec), "mbs": microbatch_size}, sort_keys=True)
    return f"{spec.kind}-{spec.n_layer}x{spec.n_embd}-b{microbatch_size}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def measure_local_device(
    *, threads: int = 1, name: str | None = None, dtype: str = "float32", on: str = "cpu"
) -> DeviceSpec:
    """Peak matmul throughput and copy bandwidth of this machine's CPU with `threads` threads, or of
    its first GPU (`on="cuda"`, timed with CUDA events; a bigger product, so the GPU is busy)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    kind = getattr(torch, dtype)
    size = 4096 if on == "cuda" else 512
    try:
        a = torch.randn(size, size, dtype=kind, device=on)
        b = torch.randn(size, size, dtype=kind, device=on)
        torch.mm(a, b)
        best = min(_timed(lambda: torch.mm(a, b), on) for _ in range(20))
        tflops = 2 * size**3 / best / 1e12
        big = torch.empty(8_000_000 * (16 if on == "cuda" else 1), dtype=kind, device=on)
        src = torch.randn(big.numel(), dtype=kind, device=on)
        big.copy_(src)
        best = min(_timed(lambda: big.copy_(src), on) for _ in range(10))
        gbs = 2 * src.numel() * src.element_size() / best / 1e9
    finally:
        torch.set_num_threads(previous)
    suffix = "" if dtype == "float32" else f"-{dtype}"
    if on == "cuda":
        gpu = torch.cuda.get_device_name(0).replace(" ", "-").lower()
        return DeviceSpec(name=name or f"local-{gpu}{suffix}", peak_tflops=tflops, memory_bandwidth_gbs=gbs,
                          dtype=dtype)
    return DeviceSpec(
        name=name or f"local-cpu-{threads}t{suffix}", peak_tflops=tflops, memory_bandwidth_gbs=gbs, dtype=dtype
    )


def _timed(fn, on: str = "cpu") -> float:
    """Seconds `fn` takes: wall time on the CPU; on a GPU, CUDA events around the kernels it
    queues (the same measure the runtime reports per stage, `runtime.parallel.device.ComputeTimer`)."""
    if on == "cuda":
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1000.0
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _time_layer(layer, inp, params, grad_out, *, takes_grad: bool, on: str):
    """One round of a layer: its output and the seconds of its forward, backward-input (0 for the
    first layer, whose input takes no gradient) and backward-weight."""
    import torch

    outs: list = []
    t_f = _timed(lambda: outs.append(layer(inp)), on)
    out = outs[0]
    t_i = _timed(lambda: torch.autograd.grad(out, inp, grad_out, retain_graph=True), on) if takes_grad else 0.0
    t_w = _timed(lambda: torch.autograd.grad(out, params, grad_out), on)
    return out, t_f, t_i, t_w


def profile_model(
    spec: ModelSpec,
    *,
    microbatch_size: int,
    instance_type: str = "local",
    device: DeviceSpec | None = None,
    repeats: int = 5,
    threads: int = 1,
    seed: int = 0,
    dtype: str = "float32",
    on: str = "cpu",
) -> ModelProfile:
    """Measure every layer of `spec` on this machine's CPU with `threads` torch threads, or on its
    first GPU (`on="cuda"`, CUDA events), computing in `dtype` (the device's dtype when a device is given)."""
    import torch

    from runtime.data.dataset import microbatch_data
    from runtime.models.model import build_layer

    spec.validate()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        device = device or measure_local_device(threads=threads, dtype=dtype, on=on)
        kind = getattr(torch, device.dtype)
        from runtime.planner.predictor import (
            layer_features,
        )  # FLOPs/bytes the same way the predictor sees them

        features = layer_features(spec, microbatch_size=microbatch_size, dtype=device.dtype)
        x, _ = microbatch_data(spec, seed=seed, step=0, index=0, size=microbatch_size)
        if x.is_floating_point():
            x = x.to(kind)
        x = x.to(on)
        layers = []
        for index in range(spec.num_layers):
            layer = build_layer(spec, index, seed).to(kind).to(on)
            params = [p for p in layer.parameters() if p.requires_grad]
            takes_grad = x.is_floating_point() and index > 0
            inp = x.detach().requires_grad_(takes_grad)
            out = layer(inp)
            grad_out = torch.randn_like(out)
            fwd, bwi, bww = [], [], []
            for rep in range(repeats + 1):
                out, t_f, t_i, t_w = _time_layer(layer, inp, params, grad_out, takes_grad=takes_grad, on=on)
                if rep:  # the first round warms caches and the allocator up
                    fwd.append(t_f)
                    bwi.append(t_i)
                    bww.append(t_w)
            layers.append(
                LayerProfile(
                    forward_s=min(fwd),
                    backward_input_s=min(bwi),
                    backward_weight_s=min(bww),
                    forward_flops=features[index].forward_flops,
                    param_bytes=features[index].param_bytes,
                    activation_bytes=features[index].activation_bytes,
                    output_bytes=features[index].output_bytes,
                    ops=features[index].ops,
                )
            )
            x = out.detach()
    finally:
        torch.set_num_threads(previous)
    return ModelProfile(
        instance_type=instance_type,
        device=device,
        model=asdict(spec),
        microbatch_size=microbatch_size,
        layers=layers,
        threads=threads,
    )


class ProfileStore:
    """Profiles on disk, one JSON file per (instance type, model, micro-batch size)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, instance_type: str, spec: ModelSpec, microbatch_size: int) -> Path:
        return self.root / instance_type / f"{model_key(spec, microbatch_size)}.json"

    def save(self, profile: ModelProfile) -> Path:
        path = self.path(profile.instance_type, profile.spec, profile.microbatch_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile.to_dict(), indent=1))
        return path

    def load(self, instance_type: str, spec: ModelSpec, microbatch_size: int) -> ModelProfile | None:
        path = self.path(instance_type, spec, microbatch_size)
        return ModelProfile.from_dict(json.loads(path.read_text())) if path.exists() else None

    def all(self) -> list[ModelProfile]:
        """Every stored profile (training data for the learned predictor)."""
        return [ModelProfile.from_dict(json.loads(p.read_text())) for p in sorted(self.root.glob("*/*.json"))]
