"""The node agent against a live control plane: enrol, heartbeat, run the worker of its assignment,
report metrics in batches, forward a notice from the metadata endpoint, hand a new generation to
the worker at a step boundary, stop without orphans; and ride out a control-plane restart."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import OperationalError

from agent.client import ControlPlaneClient
from agent.main import Agent, AgentConfig
from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.jobs.models import MetricSample
from controlplane.orchestration import services
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.metadata import MetadataServer
from controlplane.orchestration.providers.local.provider import pid_alive
from runtime.distributed.published_layout import PublishedLayout
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.agent_commands import agent_command, wire_generation, wire_job
from tests.orchestration.conftest import free_port
from tests.orchestration.fakes import FakeProvider


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OperationalError:  # SQLite's shared test database: a table briefly locked
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_agent_runs_its_assignment_and_forwards_a_notice(control_plane, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.05")
    set_provider("local", FakeProvider())
    metadata = MetadataServer(instance_id="fake-1").start()
    agent = None
    try:
        job = make_job(make_team(), strategy="recycle", target_steps=400, plan={"dp": 1, "pp": 1})
        acquisition = services.job_start(job=job)
        services.acquisition_launch(acquisition=acquisition)
        config = AgentConfig(
            control_plane=control_plane.url, enroll_key=services.acquisition_enroll_key(acquisition=acquisition),
            cloud="aws", metadata_url=metadata.url, heartbeat_s=0.2, commands_wait_s=2.0, metrics_flush_s=0.2,
            work_dir=tmp_path / "work", worker_module="tests.orchestration.fake_worker", address="127.0.0.1",
        )
        agent = Agent(config)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()

        instance = wait_for(lambda: Instance.objects.filter(job=job, state="running").first(), what="enrolment")
        first_beat = wait_for(lambda: Instance.objects.get(pk=instance.pk).last_heartbeat_at, what="heartbeat")
        wait_for(lambda: Instance.objects.get(pk=instance.pk).last_heartbeat_at > first_beat, what="heartbeats")
        services.job_grow(job=job)  # the instance_joined task's work (no worker in this test)

        wait_for(lambda: MetricSample.objects.filter(job=job).count() >= 5, what="metrics")
        pid = int((tmp_path / "work" / "worker.pid").read_text())
        assert pid_alive(pid)
        sample = MetricSample.objects.filter(job=job).order_by("step").first()
        assert sample.instance_id == instance.pk and sample.generation == 1 and sample.loss is not None

        metadata.post_notice(kind="interruption", notice_s=120)
        notice = wait_for(lambda: InterruptionNotice.objects.filter(provider_instance_id="fake-1").first(),
                          timeout=5, what="the forwarded notice")
        assert (notice.source, notice.kind, notice.action) == ("agent", "interruption", "terminate")
        assert notice.deadline is not None

        # A new generation (here: same member) is handed to the running worker, which switches at
        # a step boundary without a restart.
        from controlplane.jobs.services import job_generation_publish

        current = job.generations.get(number=1)
        job_generation_publish(job=job, membership=current.membership, layout={**current.layout, "decision": "grow"},
                               reason="test")
        wait_for(lambda: job.events.filter(kind="agent_generation_applied").exists(), what="generation applied")
        assert int((tmp_path / "work" / "worker.pid").read_text()) == pid and pid_alive(pid)

        agent.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert not pid_alive(pid), "the agent left its worker behind"
    finally:
        if agent is not None:
            agent.stop()
            agent.supervisor.stop()
        metadata.stop()
        set_provider("local", None)


def test_client_rides_out_a_control_plane_restart():
    """Requests made while the control plane is down are retried until it is back."""
    port = free_port()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            return

    servers = []

    def come_back():
        time.sleep(0.6)
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        servers.append(server)
        server.serve_forever()

    threading.Thread(target=come_back, daemon=True).start()
    client = ControlPlaneClient(f"http://127.0.0.1:{port}", backoff_s=0.05, max_backoff_s=0.2)
    started = time.monotonic()
    try:
        assert client.request("GET", "anything/") == {"ok": True}
    finally:
        for server in servers:
            server.shutdown()
    assert client.retries >= 2
    assert time.monotonic() - started >= 0.5


def test_supervisor_kills_the_worker_when_the_agent_dies(tmp_path: Path):
    """PR_SET_PDEATHSIG: a worker does not outlive a SIGKILLed agent."""
    import signal
    import subprocess
    import sys

    command = {"action": "run", "version": "v1", "instance": 1, "provider_instance_id": "i-1",
               "job": wire_job(1, target_steps=100000), "assignment": {"node": 0},
               "generation": wire_generation(1, membership=[{"instance": 1}])}
    script = tmp_path / "fake_node.py"
    script.write_text(
        "import sys, time\n"
        "from agent.supervisor import WorkerSupervisor\n"
        f"s = WorkerSupervisor({str(tmp_path / 'w')!r}, worker_module='tests.orchestration.fake_worker')\n"
        "from agent.command import AgentCommand\n"
        f"s.apply(AgentCommand.from_dict({command!r}))\n"
        "print(s.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, cwd=os.getcwd())
    worker_pid = int(proc.stdout.readline())
    assert pid_alive(worker_pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=5)
    deadline = time.monotonic() + 5
    while pid_alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(worker_pid)


def test_the_agent_reports_a_spare_worker_under_its_commands_generation(tmp_path: Path):
    # The worker's `spare` line (agent/worker_entry.py, from the runtime's "spare" event) becomes a
    # `worker_spare` event for the control plane, with the generation of the command it runs.
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path, address="127.0.0.1"))
    sent: list[dict] = []
    agent.client.event = lambda **fields: sent.append(fields)
    agent.last_command = agent_command("run", generation=3, assignment={"node": 0})
    agent._on_worker_message({"type": "spare", "generation": 7})
    assert len(sent) == 1 and sent[0]["kind"] == "worker_spare" and sent[0]["generation"] == 3
    assert "runtime generation 7 has no slot" in sent[0]["message"]


def test_a_validation_pass_reaches_the_control_plane_as_its_own_sample(tmp_path: Path):
    # The runtime's record of a validation pass has val_loss and no loss (issue 18): the worker
    # forwards it, on the step of the training record it follows, and the agent keeps it.
    from agent.worker_entry import metrics_message

    train = metrics_message({"step": 9, "loss": 2.5, "samples_per_s": 80.0, "stage_times_s": {"0": 0.1},
                             "generation": 2}, generation=3)
    val = metrics_message({"step": 9, "val_loss": 2.75, "generation": 2}, generation=3)
    assert "val_loss" not in train and train["loss"] == 2.5
    assert (val["type"], val["step"], val["val_loss"], val["loss"], val["generation"]) == ("metrics", 10, 2.75, None, 3)
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path, address="127.0.0.1"))
    agent._on_worker_message(train)
    agent._on_worker_message(val)
    first, second = agent.metrics.get_nowait(), agent.metrics.get_nowait()
    assert first["loss"] == 2.5 and "val_loss" not in first
    assert {k: v for k, v in second.items() if k != "at"} == {"step": 10, "val_loss": 2.75, "stage_times": {},
                                                              "generation": 3}


def test_the_agents_gpu_index_reaches_the_workers_spec(tmp_path: Path, monkeypatch):
    # `--gpu-index` (else SPOTPIPE_GPU_INDEX, else 0): which of the VM's GPUs a `device = "cuda"` job
    # uses. The agent writes it into the worker's spec file; agent/worker_entry.py makes it the
    # runtime's WorkerSpec.device_index. No GPU needed: nothing here touches CUDA.
    from agent.main import parse_args
    from agent.worker_entry import build_worker_spec

    monkeypatch.delenv("SPOTPIPE_GPU_INDEX", raising=False)
    assert parse_args([]).gpu_index == 0
    monkeypatch.setenv("SPOTPIPE_GPU_INDEX", "3")
    assert parse_args([]).gpu_index == 3
    assert parse_args(["--gpu-index", "2"]).gpu_index == 2  # the flag wins
    for bad in ("-1", "first"):
        with pytest.raises(SystemExit):
            parse_args(["--gpu-index", bad])

    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path, address="127.0.0.1",
                              worker_module="tests.orchestration.fake_worker", gpu_index=2))
    layout = PublishedLayout(strategy="recycle", dp=1, pp=1, slots=[[0]], decision="start",
                             rendezvous="127.0.0.1:1").to_dict()
    command = agent_command("run", job_id=5, target_steps=0, config={"device": "cuda"}, assignment={"node": 0},
                            generation=1, membership=[{"instance": 1}], layout=layout)
    try:
        assert agent.supervisor.apply(command) == "started"
    finally:
        agent.supervisor.stop()
    spec = json.loads((tmp_path / "spec-1.json").read_text())
    assert spec["device_index"] == 2
    worker_spec = build_worker_spec(spec, node=0, joining=False, out_dir=tmp_path / "out")
    assert (worker_spec.device_index, worker_spec.job_id, worker_spec.config) == (2, "job5", {"device": "cuda"})
    del spec["device_index"]  # a spec an older agent wrote: the VM's first GPU
    assert build_worker_spec(spec, node=0, joining=False, out_dir=tmp_path / "out").device_index == 0
