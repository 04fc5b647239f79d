"""`JobConfig.device` on a host without a GPU: a cuda job fails at once naming why (no node waits for a
timeout), the reasons name what to fix, and the CPU path stays as it was (staging is the identity)."""

from __future__ import annotations

import pytest
import torch

from runtime.config import JobConfig, LayoutError
from runtime.parallel import device as device_mod
from runtime.parallel.device import ComputeTimer, DeviceUnavailable, Staging, cuda_problem, resolve_device
from runtime.train.launcher import run_local
from tests.runtime.conftest import small_config


def test_an_unknown_device_is_refused_naming_the_field() -> None:
    with pytest.raises(LayoutError, match="device 'tpu' is unknown"):
        JobConfig(device="tpu").validate()


def test_cpu_resolves_to_the_cpu_whatever_the_index() -> None:
    assert resolve_device(JobConfig(), 7) == torch.device("cpu")


def test_cuda_without_a_gpu_says_why(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(DeviceUnavailable, match="is a CPU build; install the CUDA build"):
        resolve_device(JobConfig(device="cuda"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU" in cuda_problem()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "finds no GPU; check the driver (nvidia-smi)" in cuda_problem()


def test_cuda_wraps_the_index_around_the_visible_gpus(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(JobConfig(device="cuda"), 5) == torch.device("cuda", 1)


def test_on_the_cpu_staging_and_timing_change_nothing() -> None:
    staging = Staging(torch.device("cpu"))
    t = torch.arange(4.0)
    assert staging.to_host(t) is t and staging.to_device(t) is t
    assert not staging.host_buffer((2, 3), torch.float32).is_pinned()
    timer = ComputeTimer(torch.device("cpu"))
    mark = timer.start()
    timer.stop(1, mark)
    assert set(timer.seconds()) == {1} and timer.seconds()[1] >= 0
    assert device_mod.use_device(torch.device("cpu")) is None  # no CUDA settings on a CPU node


@pytest.mark.runtime
@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU; the case needs a host without one")
def test_a_cuda_job_on_nodes_without_a_gpu_fails_at_once_naming_why() -> None:
    result = run_local(small_config(device="cuda"), timeout_s=60)
    reasons = {r["reason"] for r in result.records if r.get("event") == "job_failed"}
    assert len(reasons) == 1, reasons
    (reason,) = reasons
    assert reason.startswith("device: the job asks for device cuda, but this node cannot use a GPU: "), reason
    assert not [r for r in result.records if r.get("event") == "generation"]  # no generation formed
