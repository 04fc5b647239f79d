"""The agent's entry points: `run_worker(spec, on_step)` in-process and `python -m runtime.worker`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.coordinator import Coordinator, serve
from runtime.reference import train_reference
from runtime.worker import WorkerSpec, run_worker, spec_json
from tests.runtime.conftest import small_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]


def test_run_worker_reports_every_step_through_the_callback(tmp_path) -> None:
    config = small_config(dp=1, pp=1, microbatches=4, global_batch=8, steps=3)
    store = serve(0)
    seen: list[dict] = []
    spec = WorkerSpec(
        job_id="j1",
        node=0,
        rendezvous=f"127.0.0.1:{store.port}",
        config=config.to_dict(),
        out_dir=str(tmp_path),
    )
    summary = run_worker(spec, on_step=seen.append)
    assert summary == {"node": 0, "outcome": "done", "committed": 3}
    assert [m["step"] for m in seen] == [0, 1, 2]
    assert all(m["samples_per_s"] > 0 and m["loss"] > 0 and "0" in m["stage_times_s"] for m in seen)
    expected, losses = train_reference(config)
    saved = torch.load(tmp_path / "node-0.pt", weights_only=True)["params"]
    for name, tensor in expected.items():
        torch.testing.assert_close(saved[name], tensor)
    assert [m["loss"] for m in seen] == pytest.approx(losses)
    assert Coordinator(store, "j1").store.check(["done"])


def test_cli_worker_prints_json_metrics(tmp_path) -> None:
    config = small_config(dp=1, pp=1, microbatches=2, global_batch=4, steps=2)
    store = serve(0)
    spec = WorkerSpec(job_id="j2", node=0, rendezvous=f"127.0.0.1:{store.port}", config=config.to_dict())
    (tmp_path / "spec.json").write_text(spec_json(spec))
    out = subprocess.run(
        [sys.executable, "-m", "runtime.worker", "--spec", f"@{tmp_path / 'spec.json'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=80,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [m["step"] for m in lines if "loss" in m] == [0, 1]
    assert lines[-1]["outcome"] == "done"
