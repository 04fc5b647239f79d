"""The GPU path (`device = "cuda"`) on whatever GPU this host has. Four nodes share it through the
host-staged transport (gloo over pinned host memory), lose a node to a kill and another to a notice,
and must end with the bits of their own failure-free run, and within float32 tolerance of the
single-process reference on the same GPU; one node alone must follow the CPU's loss curve to
tolerance. Skipped, with the reason printed, where there is no usable GPU (CI has none): docs/runtime.md
("The GPU path") says how and where they ran.

The scenarios are plain functions of the device, so they can be tried on the CPU too."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from runtime.config import JobConfig, ModelSpec
from runtime.parallel.device import cuda_problem
from runtime.train.launcher import Fault, RunResult, run_local
from runtime.train.reference import reference_run, train_reference
from tests.runtime.conftest import small_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.runtime,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason=f"needs a CUDA GPU: {cuda_problem() if not torch.cuda.is_available() else ''}"),
]

FAULT_TOLERANT = ("recycle", "bamboo", "oobleck", "checkpoint")


def gpu_config(strategy: str, device: str, **kw) -> JobConfig:
    """DP=2 x PP=2 tiny GPT (attention, layer norm, embedding: the GPU kernels that could be
    non-deterministic), long enough bounds for four processes sharing one GPU."""
    base = dict(
        strategy=strategy, device=device, schedule="fiw" if strategy == "recycle" else "1f1b",
        model=ModelSpec(kind="gpt", n_layer=4, n_embd=64, n_head=4, seq_len=32, vocab_size=128),
        steps=6, op_timeout_s=10.0, heartbeat_timeout_s=10.0,
    )
    if strategy == "checkpoint":
        base["checkpoint_interval"] = 2
    base.update(kw)
    return small_config(**base)


def _events(result: RunResult, name: str) -> list[dict]:
    return [r for r in result.records if r.get("event") == name]


def _assert_bits_equal(got: RunResult, expected: RunResult) -> None:
    assert set(got.params) == set(expected.params)
    for name, value in expected.params.items():
        torch.testing.assert_close(got.params[name], value, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
        for copy in got.replicas[name]:  # DP and bamboo replicas agree bit for bit too
            torch.testing.assert_close(copy, value, rtol=0, atol=0, msg=lambda m, n=name: f"{n} replica: {m}")


def kill_and_notice_keep_the_math(strategy: str, device: str, tmp_path) -> dict[str, float]:
    """A failure-free run and a run where node 1 is SIGKILLed in step 1 and node 2 gets a notice
    in step 3 (recycle, bamboo, oobleck, checkpoint): the same final bits; both within float32
    tolerance of the reference. Returns the largest difference from the reference."""
    config = gpu_config(strategy, device, checkpoint_dir=str(tmp_path) if strategy == "checkpoint" else "")
    free = run_local(config, timeout_s=150)
    faults = [Fault(node=1, kind="kill", step=1), Fault(node=2, kind="notice", step=3)]
    faulted = run_local(config, faults=faults, timeout_s=150)
    assert all(code == 0 for code in free.exit_codes.values()), free.exit_codes
    assert faulted.exit_codes[1] == -9 and faulted.exit_codes[2] == 0, faulted.exit_codes
    assert faulted.exit_codes[0] == 0 and faulted.exit_codes[3] == 0, faulted.exit_codes
    reasons = [g["reason"] for g in _events(faulted, "generation") if g["node"] == 0]
    if strategy != "checkpoint":  # checkpoint restarts on one full pipeline: node 2 is not in it then
        assert "notice" in reasons, reasons
    _assert_bits_equal(faulted, free)
    reference, _ = train_reference(config)
    worst = 0.0
    for name, expected in reference.items():
        torch.testing.assert_close(faulted.params[name], expected, msg=lambda m, n=name: f"{n}: {m}")
        worst = max(worst, float((faulted.params[name] - expected).abs().max()))
    return {"max_abs_diff_to_reference": worst}


def low_precision_keeps_the_math(precision: str, device: str) -> dict[str, object]:
    """recycle in bf16 or fp16 (a first loss scale that overflows, so steps are skipped) with node 1
    SIGKILLed in step 2: the failure-free run's bits, the reference's skipped steps, and within
    float32 tolerance of the reference. Returns the skipped steps and the largest difference."""
    extra = {"loss_scale_init": 2.0**21} if precision == "fp16" else {}
    config = gpu_config("recycle", device, precision=precision, **extra)
    free = run_local(config, timeout_s=150)
    faulted = run_local(config, faults=[Fault(node=1, kind="kill", step=2)], timeout_s=150)
    assert faulted.exit_codes[1] == -9, faulted.exit_codes
    _assert_bits_equal(faulted, free)
    reference = reference_run(config)
    skipped = sorted({r["step"] for r in faulted.steps() if r["skipped"]})
    assert skipped == reference.skipped, (skipped, reference.skipped)
    worst = 0.0
    for name, expected in reference.params.items():
        torch.testing.assert_close(faulted.params[name], expected, msg=lambda m, n=name: f"{n}: {m}")
        worst = max(worst, float((faulted.params[name] - expected).abs().max()))
    return {"skipped": skipped, "max_abs_diff_to_reference": worst}


def one_node_follows_the_cpu(device: str) -> tuple[list[float], list[float]]:
    """One node alone on `device` against the same job on the CPU: the loss per step of each."""
    config = gpu_config("none", device, dp=1, pp=1, steps=8)
    on_device = run_local(config, timeout_s=120)
    on_cpu = run_local(dataclasses.replace(config, device="cpu"), timeout_s=120)
    return _losses(on_device), _losses(on_cpu)


def _losses(result: RunResult) -> list[float]:
    steps = sorted(result.steps(), key=lambda r: r["step"])
    return [r["loss"] for r in steps]


@pytest.mark.parametrize("strategy", FAULT_TOLERANT)
def test_kill_and_notice_keep_the_math_on_one_shared_gpu(strategy: str, tmp_path) -> None:
    diff = kill_and_notice_keep_the_math(strategy, "cuda", tmp_path)
    print(f"{strategy}: largest difference from the single-process reference {diff['max_abs_diff_to_reference']:.3g}")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_under_a_kill_keeps_the_math_on_one_shared_gpu(precision: str) -> None:
    found = low_precision_keeps_the_math(precision, "cuda")
    print(f"{precision}: skipped steps {found['skipped']}, largest difference from the reference "
          f"{found['max_abs_diff_to_reference']:.3g}")


def test_none_is_the_reference_on_the_gpu_and_a_kill_ends_it_naming_why() -> None:
    config = gpu_config("none", "cuda")
    free = run_local(config, timeout_s=150)
    assert all(code == 0 for code in free.exit_codes.values()), free.exit_codes
    reference, _ = train_reference(config)
    for name, expected in reference.items():
        torch.testing.assert_close(free.params[name], expected, msg=lambda m, n=name: f"{n}: {m}")
    killed = run_local(config, faults=[Fault(node=1, kind="kill", step=1)], timeout_s=150)
    failed = [r["reason"] for r in _events(killed, "job_failed")]
    assert failed and "empty slots" in failed[0], failed


def test_one_node_on_the_gpu_follows_the_cpu_loss_curve() -> None:
    gpu, cpu = one_node_follows_the_cpu("cuda")
    assert len(gpu) == len(cpu) == 8
    assert all(math.isfinite(v) for v in gpu)
    for step, (a, b) in enumerate(zip(gpu, cpu, strict=True)):
        assert abs(a - b) <= 1e-3 * abs(b), f"step {step}: loss {a} on the GPU, {b} on the CPU"
    assert gpu[-1] < gpu[0]  # it trains


def test_sixteen_nodes_on_one_gpu_keep_the_math_through_kills_and_a_notice() -> None:
    # tests/runtime/test_sixteen_ranks.py's job and faults (one owner of each), on the GPU.
    from tests.runtime.test_sixteen_ranks import FAULTS, _config

    config = dataclasses.replace(_config(), device="cuda", op_timeout_s=10.0, heartbeat_timeout_s=10.0)
    free = run_local(config, timeout_s=200)
    faulted = run_local(config, faults=FAULTS, timeout_s=200)
    assert all(code == 0 for code in free.exit_codes.values()), free.exit_codes
    assert [faulted.exit_codes[f.node] for f in FAULTS] == [-9, -9, -9, 0], faulted.exit_codes
    _assert_bits_equal(faulted, free)
    reference, _ = train_reference(config)
    for name, expected in reference.items():
        torch.testing.assert_close(faulted.params[name], expected, msg=lambda m, n=name: f"{n}: {m}")


def test_stage_times_come_from_cuda_events() -> None:
    config = gpu_config("none", "cuda", steps=3)
    result = run_local(config, timeout_s=120)
    times = [float(v) for r in result.steps() for v in r["stage_times_s"].values()]
    assert times and all(0 < t < 5 for t in times), times
