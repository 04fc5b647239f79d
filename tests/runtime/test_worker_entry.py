"""The agent's entry points: `run_worker(spec, on_step)` in-process and `python -m runtime.train.trainer`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.distributed.coordinator import Coordinator, serve
from runtime.train.reference import train_reference
from runtime.train.trainer import WorkerSpec, run_worker, spec_json
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
        [sys.executable, "-m", "runtime.train.trainer", "--spec", f"@{tmp_path / 'spec.json'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=80,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [m["step"] for m in lines if "loss" in m] == [0, 1]
    assert lines[-1]["outcome"] == "done"


def test_sigterm_is_a_notice_for_the_cli_worker(tmp_path) -> None:
    config = small_config(strategy="recycle", dp=2, pp=1, microbatches=2, global_batch=8, steps=200)
    store = serve(0)
    procs = []
    try:
        for node in (0, 1):
            spec = WorkerSpec(
                job_id="j3", node=node, rendezvous=f"127.0.0.1:{store.port}", config=config.to_dict()
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "runtime.train.trainer", "--spec", spec_json(spec)],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        first = procs[1].stdout.readline()  # node 1 committed its first step
        assert json.loads(first)["step"] == 0
        procs[1].terminate()  # SIGTERM: leave after the current step
        out1, _ = procs[1].communicate(timeout=60)
        out0, _ = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 0 and procs[0].returncode == 0
    assert json.loads(out1.splitlines()[-1])["outcome"] == "left"
    steps0 = [json.loads(line)["step"] for line in out0.splitlines() if '"loss"' in line]
    assert steps0 == list(range(config.steps))  # the survivor lost no step
