"""Check the throughput model against the runtime: run layouts on local gloo processes and compare
the measured step time with the replayed prediction.

Runs use the runtime's emulated device time (`DeviceTime`): on 2 CPU cores several stages cannot
compute at once, so every compute action is padded to a per-layer duration and the sleeping stages
overlap as devices would. The prediction replays the same schedule with those per-layer durations;
the two costs the device-time model does not know (per-message latency of gloo on this host and the
per-step overhead of the executor: commit, optimizer bookkeeping) are fitted on calibration layouts
that are not part of the validation set.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config import DeviceTime, JobConfig, ModelSpec
from runtime.parallel.layout import pipelines_layout
from runtime.parallel.throughput import CostModel, Network


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    dp: int
    pp: int
    microbatches: int
    schedule: str
    layer_ms: float
    n_layer: int = 6

    @property
    def label(self) -> str:
        layers = self.n_layer + 2
        return f"{self.kind} L{layers} dp{self.dp} pp{self.pp} M{self.microbatches} {self.schedule} {self.layer_ms:g}ms"

    def spec(self) -> ModelSpec:
        if self.kind == "gpt":
            return ModelSpec(kind="gpt", n_layer=self.n_layer, n_embd=32, n_head=2, seq_len=16, vocab_size=64)
        return ModelSpec(kind="mlp", n_layer=self.n_layer, n_embd=32)

    def config(self, steps: int) -> JobConfig:
        ms = self.layer_ms
        return JobConfig(
            model=self.spec(),
            dp=self.dp,
            pp=self.pp,
            microbatches=self.microbatches,
            global_batch=self.dp * self.microbatches * 2,
            steps=steps,
            schedule=self.schedule,
            layer_costs=[1.0] * (self.n_layer + 2),
            device_time=DeviceTime(forward_ms=ms, backward_input_ms=ms, backward_weight_ms=ms),
        )


def measure(case: Case, *, steps: int = 10, warmup: int = 2) -> float:
    """Fastest step after `warmup` (each step timed by its slowest node) on local gloo processes.

    The minimum, not the median: on a shared 2-core machine other processes only ever add delay,
    so the least-disturbed step is the best estimate of what the layout itself costs."""
    from runtime.train.launcher import run_local  # the launcher imports torch.distributed: loaded when measuring

    result = run_local(case.config(steps), timeout_s=180)
    per_step: dict[int, float] = {}
    for rec in result.steps():
        per_step[rec["step"]] = max(per_step.get(rec["step"], 0.0), rec["step_time_s"])
    times = [t for step, t in sorted(per_step.items()) if step >= warmup]
    if not times:
        raise RuntimeError(f"{case.label}: no step finished after warm-up")
    return min(times)


def predict(case: Case, *, latency_s: float, step_overhead_s: float) -> float:
    """Replay of the runtime's schedule for `case` with emulated per-layer durations."""
    layers = case.n_layer + 2
    s = case.layer_ms / 1000.0
    cost = CostModel(
        fiw=[(s, s, s)] * layers,
        output_bytes=[0.0] * layers,
        param_bytes=[0.0] * layers,
        network=Network(bandwidth_gbps=1e6, latency_s=latency_s),
        step_overhead_s=step_overhead_s,
    )
    config = case.config(1)
    pipes = [[p * case.pp + st for st in range(case.pp)] for p in range(case.dp)]
    layout = pipelines_layout(config, pipes, costs=[1.0] * layers)
    return cost.step_time(layout, schedule=case.schedule)


def fit_overheads(measured: dict[Case, float]) -> tuple[float, float]:
    """(latency_s, step_overhead_s) minimising the squared relative error on the calibration cases."""
    best = (0.0, 0.0)
    best_err = float("inf")
    for lat_us in range(0, 5001, 100):
        for ovh_ms in range(0, 61, 1):
            err = 0.0
            for case, t in measured.items():
                p = predict(case, latency_s=lat_us / 1e6, step_overhead_s=ovh_ms / 1000)
                err += ((p - t) / t) ** 2
            if err < best_err:
                best, best_err = (lat_us / 1e6, ovh_ms / 1000), err
    return best


# Per-layer device times of 5-8 ms keep the real CPU work of these tiny models (well under 1 ms
# per action) and this host's scheduling delays small next to the emulated device time.
CALIBRATION = [
    Case("mlp", 1, 1, 4, "1f1b", 6.0),
    Case("mlp", 1, 2, 4, "1f1b", 6.0),
    Case("mlp", 1, 4, 4, "1f1b", 6.0),
]

VALIDATION = [
    Case("mlp", 2, 1, 4, "1f1b", 6.0),
    Case("mlp", 1, 2, 8, "1f1b", 5.0),
    Case("mlp", 1, 2, 8, "fiw", 5.0),
    Case("mlp", 2, 2, 4, "1f1b", 5.0),
    Case("mlp", 2, 2, 4, "fiw", 5.0),
    Case("mlp", 1, 4, 8, "1f1b", 5.0),
    Case("mlp", 1, 4, 8, "fiw", 5.0),
    Case("gpt", 1, 2, 4, "1f1b", 6.0),
    Case("gpt", 2, 2, 4, "fiw", 6.0),
    Case("gpt", 1, 4, 4, "fiw", 6.0),
    Case("mlp", 1, 3, 6, "1f1b", 8.0, n_layer=7),
    Case("mlp", 1, 8, 8, "1f1b", 5.0),
]
