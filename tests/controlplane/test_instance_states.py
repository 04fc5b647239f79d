"""The instance state machine: legal paths succeed and log events, illegal ones raise."""

from __future__ import annotations

import pytest

from controlplane.fleet.models import InstanceEvent
from controlplane.fleet.services import instance_transition
from controlplane.fleet.states import ALLOWED_TRANSITIONS, IllegalTransition, InstanceState
from tests.controlplane.factories import make_instance, make_team

pytestmark = pytest.mark.django_db


def test_spot_life_with_notice_logs_each_step():
    instance = make_instance(make_team())
    for state in ("pending", "running", "notice", "preempted"):
        instance_transition(instance=instance, to=state)
    instance.refresh_from_db()
    assert instance.state == InstanceState.PREEMPTED
    assert instance.running_at and instance.notice_at and instance.ended_at
    assert list(InstanceEvent.objects.filter(instance=instance).values_list("to_state", flat=True)) == [
        "pending", "running", "notice", "preempted",
    ]


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        (["pending", "running", "terminated"], "running"),  # terminal states never leave
        (["pending"], "notice"),  # a notice only reaches a running VM
        ([], "preempted"),  # requested capacity was never running
        (["pending", "running", "notice"], "running"),  # a notice cannot be taken back
    ],
)
def test_illegal_transition_raises_and_changes_nothing(path, illegal):
    instance = make_instance(make_team())
    for state in path:
        instance_transition(instance=instance, to=state)
    before = InstanceEvent.objects.count()
    with pytest.raises(IllegalTransition, match=f"to '{illegal}'"):
        instance_transition(instance=instance, to=illegal)
    instance.refresh_from_db()
    assert instance.state == (path[-1] if path else "requested")
    assert InstanceEvent.objects.count() == before


def test_every_state_is_in_the_table():
    assert set(ALLOWED_TRANSITIONS) == set(InstanceState.values)
