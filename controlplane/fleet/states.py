"""The instance state machine: which state may follow which. Illegal transitions raise."""

from __future__ import annotations

from django.db import models

from controlplane.common.errors import Conflict


class InstanceState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    NOTICE = "notice", "Interruption notice"
    PREEMPTED = "preempted", "Preempted"
    TERMINATED = "terminated", "Terminated"
    FAILED = "failed", "Failed"


S = InstanceState
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.REQUESTED: frozenset({S.PENDING, S.RUNNING, S.FAILED, S.TERMINATED}),
    S.PENDING: frozenset({S.RUNNING, S.PREEMPTED, S.TERMINATED, S.FAILED}),
    # A spot VM can be reclaimed with a notice first or without one.
    S.RUNNING: frozenset({S.NOTICE, S.PREEMPTED, S.TERMINATED, S.FAILED}),
    S.NOTICE: frozenset({S.PREEMPTED, S.TERMINATED, S.FAILED}),
    S.PREEMPTED: frozenset(),
    S.TERMINATED: frozenset(),
    S.FAILED: frozenset(),
}
TERMINAL_STATES = frozenset(state for state, nxt in ALLOWED_TRANSITIONS.items() if not nxt)
LIVE_STATES = frozenset({S.REQUESTED, S.PENDING, S.RUNNING, S.NOTICE})
BILLABLE_STATES = frozenset({S.RUNNING, S.NOTICE})


class IllegalTransition(Conflict):
    """Raised when a state change is not in ALLOWED_TRANSITIONS."""


def check_transition(current: str, target: str) -> None:
    """Raise IllegalTransition unless `current -> target` is allowed."""
    if target not in ALLOWED_TRANSITIONS:
        raise IllegalTransition(f"unknown instance state {target!r}", field="state")
    if target not in ALLOWED_TRANSITIONS[current]:
        allowed = ", ".join(sorted(ALLOWED_TRANSITIONS[current])) or "none (terminal state)"
        raise IllegalTransition(
            f"instance cannot go from {current!r} to {target!r}; allowed from {current!r}: {allowed}",
            field="state",
        )
