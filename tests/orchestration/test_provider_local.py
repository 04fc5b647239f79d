"""The local provider: nodes are process groups with a metadata endpoint; preemption with a notice
(served in the cloud's format, then the node dies) or without one."""

from __future__ import annotations

import time

import requests

from controlplane.orchestration.providers.base import AgentBootstrap, LaunchRequest, Pool
from controlplane.orchestration.providers.local import group_pids, pid_alive
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
    nodes = local_provider.launch(_request("job1-acq1", 2))
    again = local_provider.launch(_request("job1-acq1", 2))

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
    served = local_provider.preempt(node.provider_instance_id, notice_s=0.6)
    assert served["action"] == "terminate"

    # During the notice period the node is alive and its metadata says it is going.
    assert local_provider.describe([node.provider_instance_id])[0].state == "running"
    state = requests.get(f"{node.address}/_spotpipe/state", timeout=2).json()
    assert state["interruption"]["action"] == "terminate"
    waited = _wait_dead(local_provider, node.provider_instance_id)
    assert waited >= 0.3
    info = local_provider.node_info_file(node.provider_instance_id)
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
