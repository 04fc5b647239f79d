"""Where a node computes (`JobConfig.device`): the one place that turns `cuda` into one of this node's
GPUs, makes GPU math deterministic, stages messages between the GPU and the host memory gloo sends
from, and times compute on the device.

Messages stay on gloo (the host-staged transport): a spot VM of the p3.2xlarge / g4dn / g5 / g6
kind has one GPU and talks over TCP anyway, and gloo keeps the tags, poison and drain, timeouts and
in-process regrouping of `runtime.distributed.comm` unchanged. It also lets several nodes share one
GPU, which is how the GPU tests run on one card.
"""

from __future__ import annotations

import os
import time

import torch

from runtime.config import JobConfig

CUBLAS_WORKSPACE = ":4096:8"
"""`CUBLAS_WORKSPACE_CONFIG` for deterministic cuBLAS (what `torch.use_deterministic_algorithms`
asks for on CUDA >= 10.2); set before the process's first matrix product."""


class DeviceUnavailable(RuntimeError):
    """The job asks for a device this node does not have (no retry on this node can fix it)."""


def resolve_device(config: JobConfig, index: int = 0) -> torch.device:
    """The device this node computes on: the CPU, or GPU `index` of the visible ones (wrapped, so the
    nodes of a local run share the host's GPUs). Raises `DeviceUnavailable` saying why CUDA is not
    usable when the job asks for it."""
    if config.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"the job asks for device cuda, but this node cannot use a GPU: {cuda_problem()}")
    return torch.device("cuda", index % torch.cuda.device_count())


def cuda_problem() -> str:
    """Why `torch.cuda.is_available()` is False here, in words a user can act on."""
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU build; install the CUDA build on GPU nodes "
                "(README: 'GPU nodes')")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU; check the driver "
            "(nvidia-smi) and CUDA_VISIBLE_DEVICES")


def use_device(device: torch.device) -> None:
    """Once per process, before any CUDA work: make `device` current and GPU kernels deterministic
    (the same-math guarantee: a redone step, or another node running a micro-batch, gives the same
    bits). A no-op on the CPU."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # Attention: the fused kernels (flash, memory-efficient, cuDNN) accumulate the backward with
    # atomics, so a step redone elsewhere would not repeat its bits; the math kernel does.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    torch.cuda.set_device(device)
    # Create the CUDA context and the cuBLAS handle now, before the node meets its peers: done in
    # step 0 they take seconds when several processes share a GPU, which the step's bound would
    # otherwise have to allow for.
    ones = torch.ones(8, 8, device=device)
    (ones @ ones).sum().item()


class Staging:
    """Host <-> device copies of messages, on a CUDA stream of their own.

    Outgoing: the copy to pinned host memory waits for the compute that produced the tensor and must
    finish before gloo reads the buffer, so `to_host` returns once it has. Incoming: the copy of a
    received (pinned) buffer to the device runs on the copy stream and the compute stream only waits
    for it on the GPU, so the host goes on queueing work. On the CPU every call returns its input."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def host_buffer(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An empty host tensor to receive into (pinned on a GPU node, so its copy is asynchronous)."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.cuda)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` in host memory, complete (ready for gloo to send)."""
        if not tensor.is_cuda:
            return tensor
        assert self.stream is not None
        out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out.copy_(tensor, non_blocking=True)
        tensor.record_stream(self.stream)  # the allocator must not reuse it before the copy ran
        self.stream.synchronize()
        return out

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (host) on this node's device; later compute on the current stream sees it."""
        if not self.cuda or tensor.is_cuda:
            return tensor
        assert self.stream is not None
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = tensor.to(self.device, non_blocking=True)
        compute.wait_stream(self.stream)
        out.record_stream(compute)  # allocated on the copy stream, used on the compute stream
        return out


class ComputeTimer:
    """Busy seconds of compute actions per stage: wall time on the CPU; on a GPU, CUDA events around
    each action (its kernels run after the host queued them), read once at the end of the step."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._wall: dict[int, float] = {}
        self._events: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []

    def start(self) -> object:
        """A mark before an action's work is queued."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, stage: int, mark: object) -> None:
        """The action on `stage` that began at `mark` is queued (CPU: done)."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((stage, mark, end))  # type: ignore[arg-type]
        else:
            self._wall[stage] = self._wall.get(stage, 0.0) + time.perf_counter() - mark  # type: ignore[operator]

    def seconds(self) -> dict[int, float]:
        """Stage -> busy seconds of the actions timed so far (waits for the GPU's last one)."""
        out = dict(self._wall)
        if self._events:
            self._events[-1][2].synchronize()
            for stage, begin, end in self._events:
                out[stage] = out.get(stage, 0.0) + begin.elapsed_time(end) / 1000.0
        return out
