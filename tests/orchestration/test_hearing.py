"""Heartbeat silence during a control-plane outage is not the nodes' death (`orchestration.hearing`):
the chaos soak found that restarting the web server for a few seconds made every node look dead."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.orchestration.hearing import heartbeats_audible
from tests.controlplane.factories import make_instance, make_team

pytestmark = pytest.mark.django_db

TIMEOUT = 2.0


def _nodes(heard_ago: list[float]) -> None:
    team = make_team()
    now = timezone.now()
    for i, ago in enumerate(heard_ago):
        make_instance(team, provider_instance_id=f"node-{i}", state=InstanceState.RUNNING,
                      last_heartbeat_at=now - timedelta(seconds=ago))


def test_half_of_the_nodes_unheard_means_the_control_plane_was_deaf():
    # A web server stopping gracefully still serves a node on its kept-alive connection.
    _nodes([0.2, 9.0, 9.0, 9.0])
    assert not heartbeats_audible(timeout_s=TIMEOUT)


def test_one_silent_node_among_heard_ones_can_be_declared_lost():
    _nodes([0.2, 0.3, 9.0])
    now = timezone.now()
    assert heartbeats_audible(timeout_s=TIMEOUT, now=now - timedelta(seconds=0.5))
    assert heartbeats_audible(timeout_s=TIMEOUT, now=now)


def test_no_node_heard_means_the_control_plane_was_deaf():
    _nodes([5.0, 5.1, 5.2])  # e.g. the web server was down for 5 s
    assert not heartbeats_audible(timeout_s=TIMEOUT)


def test_silence_counts_only_a_whole_timeout_after_the_deaf_spell():
    _nodes([5.0, 5.1, 5.2])
    now = timezone.now()
    assert not heartbeats_audible(timeout_s=TIMEOUT, now=now)
    # The web server is back: one node was heard, the others not yet.
    Instance.objects.filter(provider_instance_id="node-0").update(last_heartbeat_at=now + timedelta(seconds=0.5))
    assert not heartbeats_audible(timeout_s=TIMEOUT, now=now + timedelta(seconds=1.0))
    assert not heartbeats_audible(timeout_s=TIMEOUT, now=now + timedelta(seconds=1.5))
    # Two of the three are heard again; node-2 stays silent (it really died during the outage).
    Instance.objects.exclude(provider_instance_id="node-2").update(last_heartbeat_at=now + timedelta(seconds=2.0))
    assert not heartbeats_audible(timeout_s=TIMEOUT, now=now + timedelta(seconds=2.1))  # deaf until +1.5
    Instance.objects.exclude(provider_instance_id="node-2").update(last_heartbeat_at=now + timedelta(seconds=3.5))
    assert heartbeats_audible(timeout_s=TIMEOUT, now=now + timedelta(seconds=3.6))


def test_a_detector_that_did_not_run_for_a_timeout_was_deaf():
    _nodes([0.1, 0.2])  # heartbeats land as soon as the database is back, before the detector runs
    now = timezone.now()
    assert heartbeats_audible(timeout_s=TIMEOUT, now=now - timedelta(seconds=10))
    assert not heartbeats_audible(timeout_s=TIMEOUT, now=now)  # 10 s without a run: the database was down
    Instance.objects.update(last_heartbeat_at=now + timedelta(seconds=1.5))
    assert not heartbeats_audible(timeout_s=TIMEOUT, now=now + timedelta(seconds=1.0))
    assert heartbeats_audible(timeout_s=TIMEOUT, now=now + timedelta(seconds=2.1))
