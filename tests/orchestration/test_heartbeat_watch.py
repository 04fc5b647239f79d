"""Heartbeat silence during a control-plane outage is not the nodes' death (`orchestration.heartbeat_watch`):
the chaos soak found that restarting the web server for a few seconds made every node look dead, and
then, with a first fix, that a web server shutting down still serves some nodes for a while."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.orchestration.heartbeat_watch import heard_until
from tests.controlplane.factories import make_instance, make_team

pytestmark = pytest.mark.django_db

TIMEOUT = 2.0


def _nodes(heard_ago: list[float]) -> None:
    team = make_team()
    now = timezone.now()
    for i, ago in enumerate(heard_ago):
        make_instance(team, provider_instance_id=f"node-{i}", state=InstanceState.RUNNING,
                      last_heartbeat_at=now - timedelta(seconds=ago))


def _heard(node: int, at) -> None:
    Instance.objects.filter(provider_instance_id=f"node-{node}").update(last_heartbeat_at=at)


def test_one_silent_node_among_heard_ones_is_measured_against_the_majority():
    _nodes([0.2, 0.3, 0.4, 9.0])
    now = timezone.now()
    assert heard_until(timeout_s=TIMEOUT, now=now - timedelta(seconds=0.5)) is not None
    until = heard_until(timeout_s=TIMEOUT, now=now)
    # The third most recent heartbeat of four: a strict majority was heard until then.
    third = sorted(Instance.objects.values_list("last_heartbeat_at", flat=True), reverse=True)[2]
    assert until == third
    assert Instance.objects.get(provider_instance_id="node-3").last_heartbeat_at < until - timedelta(seconds=TIMEOUT)


def test_no_majority_heard_means_the_control_plane_was_deaf():
    _nodes([5.0, 5.1, 5.2])  # e.g. the web server was down for 5 s
    assert heard_until(timeout_s=TIMEOUT) is None


def test_half_of_the_nodes_unheard_means_the_control_plane_was_deaf():
    # A web server stopping gracefully still serves a node on its kept-alive connection.
    _nodes([0.2, 9.0, 9.0, 9.0])
    assert heard_until(timeout_s=TIMEOUT) is None


def test_a_node_cut_off_while_the_others_were_still_served_is_not_lost():
    # Node 3 lost its connection when the web server began to stop (t=0); the others were served on
    # kept-alive connections until t=3 (the graceful shutdown); the detector runs at t=5.5 with the
    # soak's 5 s timeout: the clock is still running for node 3 only up to t=3.
    now = timezone.now()
    _nodes([0, 0, 0, 0])
    t0 = now - timedelta(seconds=5.5)
    for node in range(3):
        _heard(node, t0 + timedelta(seconds=3))
    _heard(3, t0)
    assert heard_until(timeout_s=5.0, now=now - timedelta(seconds=1)) is not None
    until = heard_until(timeout_s=5.0, now=now)
    assert until == t0 + timedelta(seconds=3)
    assert not Instance.objects.filter(last_heartbeat_at__lt=until - timedelta(seconds=5.0)).exists()


def test_silence_counts_only_a_whole_timeout_after_the_deaf_spell():
    _nodes([5.0, 5.1, 5.2])
    now = timezone.now()
    assert heard_until(timeout_s=TIMEOUT, now=now) is None
    # The web server is back: one node was heard, the others not yet.
    _heard(0, now + timedelta(seconds=0.5))
    assert heard_until(timeout_s=TIMEOUT, now=now + timedelta(seconds=1.0)) is None
    assert heard_until(timeout_s=TIMEOUT, now=now + timedelta(seconds=1.5)) is None
    # Two of the three are heard again; node-2 stays silent (it really died during the outage).
    for node in (0, 1):
        _heard(node, now + timedelta(seconds=2.0))
    assert heard_until(timeout_s=TIMEOUT, now=now + timedelta(seconds=2.1)) is None  # deaf until +1.5
    for node in (0, 1):
        _heard(node, now + timedelta(seconds=3.5))
    assert heard_until(timeout_s=TIMEOUT, now=now + timedelta(seconds=3.6)) == now + timedelta(seconds=3.5)


def test_a_detector_that_did_not_run_for_a_timeout_was_deaf():
    _nodes([0.1, 0.2])  # heartbeats land as soon as the database is back, before the detector runs
    now = timezone.now()
    assert heard_until(timeout_s=TIMEOUT, now=now - timedelta(seconds=10)) is not None
    assert heard_until(timeout_s=TIMEOUT, now=now) is None  # 10 s without a run: the database was down
    Instance.objects.update(last_heartbeat_at=now + timedelta(seconds=1.5))
    assert heard_until(timeout_s=TIMEOUT, now=now + timedelta(seconds=1.0)) is None
    assert heard_until(timeout_s=TIMEOUT, now=now + timedelta(seconds=2.1)) is not None
