"""Writes on instances. Every state change goes through `instance_transition`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.accounts.services import agent_tokens_revoke
from controlplane.common.agent_wake import commands_changed
from controlplane.fleet.bulk import bulk_update_by_pk
from controlplane.fleet.locks import lock_instance
from controlplane.fleet.models import Instance, InstanceEvent
from controlplane.fleet.states import TERMINAL_STATES, InstanceState, check_transition

_STAMP_FIELD = {
    InstanceState.RUNNING: "running_at",
    InstanceState.NOTICE: "notice_at",
    InstanceState.PREEMPTED: "ended_at",
    InstanceState.TERMINATED: "ended_at",
    InstanceState.FAILED: "ended_at",
}


@transaction.atomic
def instance_transition(
    *, instance: Instance, to: str, at: datetime | None = None, detail: dict[str, Any] | None = None
) -> Instance:
    """Move `instance` to state `to` (raising IllegalTransition if the state machine forbids it),
    stamp the matching timestamp and append an InstanceEvent. Locks the row, so two concurrent
    callers serialise and the second sees the first's result."""
    at = at or timezone.now()
    locked = lock_instance(instance)  # its job first: the one lock order (fleet.locks)
    check_transition(locked.state, to)
    previous = locked.state
    locked.state = to
    locked.state_changed_at = at
    fields = ["state", "state_changed_at", "updated_at"]
    stamp = _STAMP_FIELD.get(InstanceState(to))
    if stamp and getattr(locked, stamp) is None:
        setattr(locked, stamp, at)
        fields.append(stamp)
    locked.save(update_fields=fields)
    InstanceEvent.objects.create(
        instance=locked, kind="state", from_state=previous, to_state=to, at=at, detail=detail or {}
    )
    if to in TERMINAL_STATES:
        # An ended node (released, terminated, preempted, failed) keeps no access.
        agent_tokens_revoke(instance_ids=[locked.pk], at=at)
    commands_changed(instance_ids=[locked.pk])
    # Keep the caller's object in step with the database.
    for field in fields:
        setattr(instance, field, getattr(locked, field))
    return instance


def instance_transition_locked(
    *, instance: Instance, to: str, at: datetime, detail: dict[str, Any] | None = None
) -> InstanceEvent:
    """`instance_transition` for a caller that already holds the row lock and loaded the row in the
    same transaction (the notice processor locks a batch's instances at once): moves the object in
    memory and returns the unsaved InstanceEvent; the caller saves both in bulk (the instance's
    TRANSITION_FIELDS) and revokes the agent tokens of those that ended (`agent_tokens_revoke`).
    Raises IllegalTransition like `instance_transition`."""
    check_transition(instance.state, to)
    previous = instance.state
    instance.state = to
    instance.state_changed_at = at
    instance.updated_at = at
    stamp = _STAMP_FIELD.get(InstanceState(to))
    if stamp and getattr(instance, stamp) is None:
        setattr(instance, stamp, at)
    return InstanceEvent(instance=instance, kind="state", from_state=previous, to_state=to, at=at,
                         detail=detail or {})


TRANSITION_FIELDS = ("state", "state_changed_at", "updated_at", "running_at", "notice_at", "ended_at")


def instances_moved_save(*, moved: list[Instance], events: list[InstanceEvent], at: datetime) -> None:
    """Write what `instance_transition_locked` did to `moved` in memory, in bulk: their events, their
    rows (TRANSITION_FIELDS), the agent tokens of those that ended revoked, and their agents woken.
    A fixed number of statements however many moved (a notice batch, a job's release)."""
    if not moved:
        return
    InstanceEvent.objects.bulk_create(events)
    bulk_update_by_pk(Instance, moved, TRANSITION_FIELDS)
    commands_changed(instance_ids=[i.pk for i in moved])
    agent_tokens_revoke(instance_ids=[i.pk for i in moved if i.state in TERMINAL_STATES], at=at)

