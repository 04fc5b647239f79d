"""A worker that crashed and was restarted by its agent comes back to training.

The agent restarts a worker that exits with a crash code (not 0, 3 or 4) by applying its last `run`
command again (`Agent._on_worker_exit`), which starts `agent.worker_entry` with the same spec. An
original member used to come back as generation 0's member: the survivors had already formed a
generation without it, so the runtime fenced it (exit 3) and the node idled until the control
plane replaced it. Now every start after the first is a new incarnation of the node that joins
through the runtime's join path. Real processes: four `agent.worker_entry` workers started by the
agent's `WorkerSupervisor`, one SIGKILLed mid-run and started again as the agent does."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.command import AgentCommand
from agent.supervisor import WorkerSupervisor
from agent.worker_entry import INCARNATION_STRIDE, runtime_node
from runtime.config import DeviceTime, JobConfig, ModelSpec
from runtime.distributed.coordinator import Coordinator, serve
from runtime.distributed.published_layout import PublishedLayout
from runtime.train.reference import train_reference
from tests.orchestration.agent_commands import wire_generation, wire_job
from tests.orchestration.conftest import wait_for
from tests.runtime.conftest import small_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(240)]


def test_runtime_ids_of_incarnations_are_distinct() -> None:
    assert runtime_node(3, 0) == 3  # a first start keeps the control plane's node id
    ids = {runtime_node(n, k) for n in range(8) for k in range(3)}
    assert len(ids) == 24 and runtime_node(3, 2) == 3 + 2 * INCARNATION_STRIDE
    with pytest.raises(ValueError, match="node id 1000000 / incarnation 1"):
        runtime_node(INCARNATION_STRIDE, 1)  # would be incarnation 2 of node 0
    with pytest.raises(ValueError, match="incarnation -1"):
        runtime_node(3, -1)


def test_crashed_member_restarted_by_its_agent_rejoins_and_trains_to_the_end(tmp_path: Path) -> None:
    # Steps padded to emulated device time, so the job outlasts the restarted worker's start-up
    # (importing torch: seconds on a loaded machine) by a wide margin.
    steps = 400
    config = small_config(strategy="recycle", schedule="fiw", steps=steps, device_time=DeviceTime(forward_ms=4.0))
    store = serve(0)
    # The job's stored contract is the runtime's config: the agent hands it over unchanged.
    job = wire_job(7, target_steps=steps, config=config.to_dict())
    layout = PublishedLayout(strategy="recycle", dp=2, pp=2, slots=[[0, 1], [2, 3]], decision="start",
                             nodes=[(n, n) for n in range(4)], rendezvous=f"127.0.0.1:{store.port}").to_dict()
    generation = wire_generation(1, layout=layout, membership=[{"node": n} for n in range(4)])
    messages: dict[int, list[dict]] = {n: [] for n in range(4)}
    exits: dict[int, list[int]] = {n: [] for n in range(4)}
    lock = threading.Lock()

    def supervisor(node: int) -> WorkerSupervisor:
        def on_message(message: dict) -> None:
            with lock:
                messages[node].append(message)

        def on_exit(code: int, deliberate: bool) -> None:
            with lock:
                exits[node].append(code)

        return WorkerSupervisor(tmp_path / f"node{node}", on_message=on_message, on_exit=on_exit)

    def command(node: int) -> AgentCommand:
        return AgentCommand.from_dict({"action": "run", "version": "v1", "instance": 100 + node,
                                       "provider_instance_id": f"i-{node}", "job": job, "generation": generation,
                                       "assignment": {"node": node}})

    sups = {n: supervisor(n) for n in range(4)}
    try:
        for n, sup in sups.items():
            assert sup.apply(command(n)) == "started"

        def committed(node: int) -> int:
            with lock:
                return max((m["step"] for m in messages[node] if m.get("type") == "metrics"), default=0)

        assert wait_for(lambda: committed(1) >= 5, timeout_s=120), "the job did not start"
        os.kill(sups[1].proc.pid, signal.SIGKILL)  # a crash: the agent restarts such a worker
        assert wait_for(lambda: exits[1] == [-9], timeout_s=30)
        crashed_at = committed(1)
        assert sups[1].apply(command(1)) == "started"  # what the agent's restart does
        assert wait_for(lambda: all(len(exits[n]) == (2 if n == 1 else 1) for n in range(4)), timeout_s=180)
    finally:
        for sup in sups.values():
            sup.stop()
    assert [exits[n][-1] for n in range(4)] == [0, 0, 0, 0], exits
    restarted = [m for m in messages[1] if m.get("type") == "metrics" and m["step"] > crashed_at]
    assert restarted and restarted[-1]["step"] == steps, "the restarted node trains to the end"
    kinds = [m["type"] for m in messages[1]]
    assert "fenced" not in kinds and kinds[-1] == "done"
    coordinator = Coordinator(store, "job7")
    assert coordinator.store.check([f"dead/{runtime_node(1, 0)}"]), "the crashed incarnation is marked dead"
    assert coordinator.store.check([f"joined/{runtime_node(1, 1)}"]), "the new one came in by the join path"
    # Same math as the failure-free run, bit for bit, on every node that finished.
    expected, _ = train_reference(config)
    copies = [torch.load(p, weights_only=True)["params"] for p in sorted(tmp_path.glob("node*/out/node-*.pt"))]
    assert len(copies) == 4
    assert {name for copy in copies for name in copy} == set(expected)
    for copy in copies:
        for name, tensor in copy.items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def _one_node_entry_args(tmp_path: Path, job_id: int) -> tuple[Any, list[str]]:
    """A rendezvous store and `agent.worker_entry` arguments for a one-node job (DP=1 x PP=1)."""
    store = serve(0)
    layout = PublishedLayout(strategy="recycle", dp=1, pp=1, slots=[[0]], decision="start", nodes=[(0, 0)],
                             rendezvous=f"127.0.0.1:{store.port}").to_dict()
    generation = wire_generation(1, layout=layout, membership=[{"node": 0}])
    config = JobConfig(model=ModelSpec(kind="mlp", n_layer=2), dp=1, pp=1, microbatches=2, global_batch=4,
                       strategy="recycle", steps=3, seed=1)
    job = wire_job(job_id, target_steps=3, config=config.to_dict())
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"job": job, "generation": generation, "assignment": {"node": 0},
                                "instance": 100, "work_dir": str(tmp_path / "node0")}))
    control = tmp_path / "control.json"
    control.write_text(json.dumps(generation))
    return store, ["--spec", str(spec), "--control", str(control)]


def test_a_worker_that_crashes_on_an_exception_marks_itself_dead_at_once(tmp_path: Path, monkeypatch) -> None:
    """The survivors need not wait for a crashed worker's heartbeat to go stale: the dying process
    writes its own dead mark (a SIGKILL cannot, and is covered by the restart's mark above)."""
    from agent import worker_entry
    from runtime.train import trainer as runtime_worker

    store, args = _one_node_entry_args(tmp_path, 9)

    def crash(self) -> dict:
        raise RuntimeError("a bug in the worker")

    monkeypatch.setattr(runtime_worker.Worker, "run", crash)
    coordinator = Coordinator(store, "job9")
    assert not coordinator.store.check(["dead/0"])
    with pytest.raises(RuntimeError, match="a bug in the worker"):
        worker_entry.main(args)
    assert coordinator.store.check(["dead/0"]), "the crashed worker marked itself dead"


def test_the_runtimes_spare_event_reaches_the_agent_as_a_spare_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A replacement the runtime has no slot for stands by (tests/runtime/test_spares.py); the
    worker says so to its agent, which puts it on the job's timeline (test_agent_live.py)."""
    from agent import worker_entry
    from runtime.train import trainer as runtime_worker

    _store, args = _one_node_entry_args(tmp_path, 10)

    def stand_by_then_finish(self) -> dict:
        self.emit({"event": "spare", "generation": 4})  # what Worker.run emits when told spare/<node>
        return {"node": self.node, "outcome": "done", "committed": 3}

    monkeypatch.setattr(runtime_worker.Worker, "run", stand_by_then_finish)
    assert worker_entry.main(args) == 0
    lines = [json.loads(line.removeprefix("SPOTPIPE ")) for line in capsys.readouterr().out.splitlines()
             if line.startswith("SPOTPIPE ")]
    assert {"type": "spare", "generation": 4} in lines
