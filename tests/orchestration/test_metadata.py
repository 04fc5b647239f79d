"""The local metadata endpoint speaks the clouds' real formats, and the agent's watchers read them."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import pytest
import requests

from agent.metadata import AwsImdsWatcher, AzureWatcher, GcpWatcher, make_watcher
from controlplane.orchestration.providers.local.metadata import MetadataServer


@pytest.fixture
def server():
    fired: list[float] = []
    srv = MetadataServer(instance_id="local-abc-0", on_notice=fired.append).start()
    srv.fired = fired
    yield srv
    srv.stop()


def test_aws_imdsv2_needs_a_token_and_serves_the_real_shapes(server, shared_data):
    base = server.url
    assert requests.get(f"{base}/latest/meta-data/instance-id", timeout=2).status_code == 401
    assert requests.put(f"{base}/latest/api/token", timeout=2).status_code == 400  # TTL header required
    token = requests.put(f"{base}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                         timeout=2).text
    headers = {"X-aws-ec2-metadata-token": token}
    assert requests.get(f"{base}/latest/meta-data/instance-id", headers=headers, timeout=2).text == "local-abc-0"
    assert requests.get(f"{base}/latest/meta-data/spot/instance-action", headers=headers, timeout=2).status_code == 404

    before = datetime.now(UTC).replace(microsecond=0)
    server.post_notice(kind="interruption", notice_s=120)
    body = requests.get(f"{base}/latest/meta-data/spot/instance-action", headers=headers, timeout=2).json()
    sample = json.loads((shared_data / "cloud-events" / "aws-imds-spot-instance-action.json").read_text())
    assert set(body) == set(sample) and body["action"] == "terminate"
    deadline = datetime.fromisoformat(body["time"].replace("Z", "+00:00"))
    assert 118 <= (deadline - before).total_seconds() <= 122
    assert len(server.fired) == 1

    server.post_notice(kind="rebalance")
    rebalance = requests.get(f"{base}/latest/meta-data/events/recommendations/rebalance", headers=headers,
                             timeout=2).json()
    sample = json.loads((shared_data / "cloud-events" / "aws-imds-rebalance.json").read_text())
    assert set(rebalance) == set(sample)


def test_aws_watcher_reports_each_notice_once(server):
    watcher = AwsImdsWatcher(server.url)
    assert watcher.instance_id() == "local-abc-0"
    assert watcher.poll() == []
    server.post_notice(kind="interruption", notice_s=2)
    (notice,) = watcher.poll()
    assert (notice.kind, notice.action, notice.cloud) == ("interruption", "terminate", "aws")
    assert 0 < (notice.deadline - datetime.now(UTC)).total_seconds() <= 3
    assert watcher.poll() == []


def test_gcp_preempted_flag_and_wait_for_change(server):
    base = server.url
    url = f"{base}/computeMetadata/v1/instance/preempted"
    assert requests.get(url, timeout=2).status_code == 403  # Metadata-Flavor required
    response = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=2)
    assert response.text == "FALSE" and response.headers["Metadata-Flavor"] == "Google"

    threading.Timer(0.2, lambda: server.post_notice(notice_s=30)).start()
    started = time.monotonic()
    changed = requests.get(url, headers={"Metadata-Flavor": "Google"}, params={"wait_for_change": "true"}, timeout=5)
    assert changed.text == "TRUE" and time.monotonic() - started >= 0.15

    watcher = GcpWatcher(base, wait_s=1)
    assert watcher.instance_id() == "local-abc-0"
    (notice,) = watcher.poll()
    assert (notice.kind, notice.action, notice.cloud) == ("interruption", "preempt", "gcp")
    assert watcher.poll() == []


def test_azure_scheduled_events_preempt(server, shared_data):
    base = server.url
    url = f"{base}/metadata/scheduledevents"
    assert requests.get(url, params={"api-version": "2020-07-01"}, timeout=2).status_code == 400  # header
    empty = requests.get(url, headers={"Metadata": "true"}, params={"api-version": "2020-07-01"}, timeout=2).json()
    assert empty == {"DocumentIncarnation": 0, "Events": []}

    server.post_notice(notice_s=30)
    document = requests.get(url, headers={"Metadata": "true"}, params={"api-version": "2020-07-01"}, timeout=2).json()
    sample = json.loads((shared_data / "cloud-events" / "azure-scheduled-events-preempt.json").read_text())
    assert set(document) == set(sample)
    (event,) = document["Events"]
    assert set(event) == set(sample["Events"][0])
    assert event["EventType"] == "Preempt" and event["Resources"] == ["local-abc-0"]

    watcher = make_watcher("azure", base)
    assert isinstance(watcher, AzureWatcher) and watcher.instance_id() == "local-abc-0"
    (notice,) = watcher.poll()
    assert notice.cloud == "azure" and 25 <= (notice.deadline - datetime.now(UTC)).total_seconds() <= 31
    assert watcher.poll() == []
