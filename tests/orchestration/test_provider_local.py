"""The local provider: nodes are process groups with a metadata endpoint; preemption with a notice
(served in the cloud's format, then the node dies) or without one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import requests

from controlplane.orchestration.providers.base import AgentBootstrap, LaunchRequest, Pool
from controlplane.orchestration.providers.local.provider import group_pids, pid_alive
from tests.orchestration.conftest import free_port


def _request(token: str, count: int) -> LaunchRequest:
    # The control plane is a closed port: the agents keep retrying, which is all these tests need.
    return LaunchRequest(
        client_token=token, count=count, pools=(Pool(instance_type="local.node", zone="local"),),
        bootstrap=AgentBootstrap(control_plane_url=f"http://127.0.0.1:{free_port()}", enroll_key="1.x"),
    )


def _wait_dead(provider, node_id: str, timeout: float = 10.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if provider.describe([node_id])[0].state == "terminated":
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{node_id} still alive after {timeout}s")


def test_launch_is_idempotent_and_nodes_serve_metadata(local_provider):
    request = _request("job1-acq1", 2)
    nodes = local_provider.launch(request)
    again = local_provider.launch(request)  # a retried launch: same token, key and control plane

    assert [n.provider_instance_id for n in nodes] == [n.provider_instance_id for n in again]
    assert all(n.state == "running" for n in nodes)
    assert len({local_provider.node_info_file(n.provider_instance_id)["pid"] for n in again}) == 2
    for node in nodes:
        token = requests.put(f"{node.address}/latest/api/token",
                             headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout=2).text
        instance_id = requests.get(f"{node.address}/latest/meta-data/instance-id",
                                   headers={"X-aws-ec2-metadata-token": token}, timeout=2).text
        assert instance_id == node.provider_instance_id


def test_preempt_with_notice_then_the_node_dies(local_provider):
    (node,) = local_provider.launch(_request("job2-acq1", 1))
    # Long enough for the checks below to run inside the notice period on a loaded machine (0.6 s
    # was a budget a stalled test process could miss: the node was gone before they ran).
    notice_s = 3.0
    noticed_at = time.monotonic()
    served = local_provider.preempt(node.provider_instance_id, notice_s=notice_s)
    assert served["action"] == "terminate"

    # During the notice period the node is alive and its metadata says it is going.
    assert local_provider.describe([node.provider_instance_id])[0].state == "running"
    state = requests.get(f"{node.address}/_spotpipe/state", timeout=2).json()
    assert state["interruption"]["action"] == "terminate"
    _wait_dead(local_provider, node.provider_instance_id)
    assert time.monotonic() - noticed_at >= notice_s  # it lived out its notice
    info = local_provider.node_info_file(node.provider_instance_id)
    # The whole group got the SIGKILL; the agent is a process of its own, which may still be exiting
    # the moment the node's process is gone.
    deadline = time.monotonic() + 5.0
    while group_pids(info["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_pids(info["pgid"]) == []


def test_kill_without_notice_and_terminate(local_provider):
    a, b = local_provider.launch(_request("job3-acq1", 2))
    local_provider.kill(a.provider_instance_id)
    _wait_dead(local_provider, a.provider_instance_id, timeout=3)

    local_provider.terminate([b.provider_instance_id, "local-unknown"])
    info = local_provider.node_info_file(b.provider_instance_id)
    assert not pid_alive(info["pid"])
    states = [n.state for n in local_provider.describe([a.provider_instance_id, b.provider_instance_id, "local-x"])]
    assert states == ["terminated", "terminated", "missing"]
    assert local_provider.live_pids() == []


def _bootstrap_for(token: str, url: str) -> LaunchRequest:
    return LaunchRequest(client_token=token, count=1, pools=(Pool(instance_type="local.node", zone="local"),),
                         bootstrap=AgentBootstrap(control_plane_url=url, enroll_key="1.x"))


def test_a_live_leftover_of_an_earlier_run_is_cleared_not_adopted(local_provider):
    # An earlier run (another control plane, same token: a database reset in a reused var dir).
    (old,) = local_provider.launch(_bootstrap_for("job7-acq1", f"http://127.0.0.1:{free_port()}"))
    old_pid = local_provider.node_info_file(old.provider_instance_id)["pid"]
    assert pid_alive(old_pid)

    request = _bootstrap_for("job7-acq1", f"http://127.0.0.1:{free_port()}")
    (new,) = local_provider.launch(request)
    assert new.provider_instance_id == old.provider_instance_id and new.state == "running"
    info = local_provider.node_info_file(new.provider_instance_id)
    assert info["pid"] != old_pid and not pid_alive(old_pid)  # the leftover was killed, a fresh node runs
    assert info["launch"] == local_provider.launch_id(request)
    # A retry of *this* launch adopts the fresh node as it is.
    (again,) = local_provider.launch(request)
    assert local_provider.node_info_file(again.provider_instance_id)["pid"] == info["pid"]


def test_a_dead_leftover_is_replaced_but_a_dead_node_of_this_launch_is_not(local_provider):
    request = _bootstrap_for("job8-acq1", f"http://127.0.0.1:{free_port()}")
    (node,) = local_provider.launch(request)
    local_provider.kill(node.provider_instance_id)
    _wait_dead(local_provider, node.provider_instance_id, timeout=3)
    # The same launch retried: the node it started has died since; it is reported, not restarted.
    (same,) = local_provider.launch(request)
    assert same.state == "terminated"

    # Another run with the same token: the dead directory is a leftover; a fresh node starts.
    (fresh,) = local_provider.launch(_bootstrap_for("job8-acq1", f"http://127.0.0.1:{free_port()}"))
    assert fresh.state == "running"


def test_a_reused_pid_is_neither_adopted_nor_signalled(local_provider):
    import json
    import subprocess
    import sys

    request = _bootstrap_for("job9-acq1", f"http://127.0.0.1:{free_port()}")
    (node_id,) = local_provider.node_ids_for(request)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        # A directory that claims this launch's node, but its pid now belongs to another process.
        directory = local_provider.node_dir(node_id)
        directory.mkdir(parents=True)
        launch = local_provider.launch_id(request)
        (directory / "launch.json").write_text(json.dumps({"launch": launch, "spawned_at": 0}))
        (directory / "node.json").write_text(json.dumps({
            "node_id": node_id, "pid": bystander.pid, "pgid": bystander.pid, "metadata_url": "http://127.0.0.1:9",
            "launch": launch, "proc_start": 1}))
        assert local_provider.describe([node_id])[0].state == "terminated"  # not the node, whatever the pid says
        local_provider.kill(node_id)
        local_provider.terminate([node_id])
        assert bystander.poll() is None, "a process that merely reused the pid was signalled"

        (node,) = local_provider.launch(request)
        assert node.state == "running"
        assert local_provider.node_info_file(node_id)["pid"] != bystander.pid
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_local_nodes_agent_installs_job_requirements_as_a_cloud_nodes_does(local_provider):
    # The embedded default tries the code-shipping path for real: its agent is not `--no-requirements`
    # (the install itself: tests/orchestration/test_requirements_install.py, the same agent code).
    (node,) = local_provider.launch(_request("job9-acq1", 1))
    info = local_provider.node_info_file(node.provider_instance_id)
    deadline = time.monotonic() + 30.0
    agent = None
    while agent is None and time.monotonic() < deadline:
        for pid in group_pids(info["pgid"]):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agent.main" in argv:
                agent = argv
        time.sleep(0.05)
    assert agent is not None, "the node's agent did not start"
    assert b"--no-requirements" not in agent and b"--work-dir" in agent


def test_a_node_and_the_code_on_it_never_get_the_control_planes_secrets(local_provider, monkeypatch):
    """A team's code runs on a node: the node process (and the agent and workers under it) gets
    what a process needs and the variables named in SPOTPIPE_LOCAL_NODE_ENV, never the control
    plane's secret key, database password or cloud keys."""
    secrets = {"SECRET_KEY": "cp-secret-key", "DATABASE_URL": "postgres://u:db-password@db/x",
               "AWS_SECRET_ACCESS_KEY": "cp-aws-secret", "SPOTPIPE_METRICS_TOKEN": "cp-metrics-token",
               "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    for name, value in {**secrets, "AWS_ACCESS_KEY_ID": "store-key", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPOTPIPE_LOCAL_NODE_ENV", "SPOTPIPE_TEST_SESSION, AWS_ACCESS_KEY_ID")
    (node,) = local_provider.launch(_request("job-env-acq1", 1))
    pid = local_provider.node_info_file(node.provider_instance_id)["pid"]
    environ = dict(entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if entry)
    assert not set(secrets) & set(environ), sorted(environ)
    assert not any(value in Path(f"/proc/{pid}/environ").read_text() for value in secrets.values())
    assert environ["AWS_ACCESS_KEY_ID"] == "store-key" and environ["OMP_NUM_THREADS"] == "1"
    assert environ["PATH"] == os.environ["PATH"] and environ["SPOTPIPE_ENROLL_KEY"] == "1.x"
