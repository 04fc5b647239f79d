"""Agent heartbeats: the write behind `POST /api/v1/instances/{id}/heartbeat/`."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from controlplane.common.errors import Conflict
from controlplane.fleet.models import Instance
from controlplane.fleet.states import TERMINAL_STATES


def instance_heartbeat_record(
    *, instance: Instance, at: datetime | None = None, agent_address: str | None = None
) -> Instance:
    """Stamp `last_heartbeat_at` (it only moves forward) and, when given, the agent's address.

    One conditional UPDATE, no row lock: heartbeats are frequent and must not queue behind a
    reconfiguration that holds the job or instance. An ended instance answers Conflict (409), which
    tells its agent to stop rather than keep a dead node looking alive."""
    if instance.state in TERMINAL_STATES:
        raise Conflict(f"instance is {instance.state!r}; it takes no heartbeats", field="state")
    at = at or timezone.now()
    changes: dict[str, object] = {"last_heartbeat_at": at}
    if agent_address:
        changes["agent_address"] = agent_address[:200]
    updated = (
        Instance.objects.filter(pk=instance.pk)
        .exclude(state__in=TERMINAL_STATES)
        .filter(Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=at))
        .update(**changes)
    )
    if updated:
        for field, value in changes.items():
            setattr(instance, field, value)
    else:
        instance.refresh_from_db(fields=["state", "last_heartbeat_at", "agent_address"])
        if instance.state in TERMINAL_STATES:
            raise Conflict(f"instance is {instance.state!r}; it takes no heartbeats", field="state")
    return instance
