"""Whether missing heartbeats mean dead nodes or a deaf control plane.

A node is declared lost when its heartbeats stop for the heartbeat timeout. But when the control
plane itself stops hearing (its web server restarts, its database restarts, its worker or beat is
down), every node's heartbeat goes stale at once, and counting that silence against the nodes would
declare all of them dead and replace them (found by the chaos soak, `bench/chaos.py`). So:

- the control plane was deaf when at most half of the running nodes were heard within the timeout
  (a web server going down may still serve a node or two on kept-alive connections, so "nobody
  heard" is not enough), or when the detector itself has not run for longer than the timeout
  (database, worker or beat down);
- a node's silence only counts from the end of the last deaf spell: nobody is declared lost by
  heartbeat until the control plane has been listening again for a whole timeout;
- and a node is lost only when a majority of the nodes was heard for a whole timeout after its last
  heartbeat (its silence is measured against what the control plane could hear, not the clock).

Nodes that die together (half of them or more, or the only node) are then left to the provider's
view (`capacity_reconcile` asks the provider every few seconds and marks the nodes it reports gone)
and to their notices, not to heartbeats."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.orchestration.models import HeartbeatWatch


@transaction.atomic
def heard_until(*, timeout_s: float, now: datetime | None = None) -> datetime | None:
    """Record this run of the detector. Returns the time up to which the control plane has heard a
    strict majority of the running nodes (the clock against which a node's silence is measured:
    a node is lost when the majority was heard for a whole timeout after its last heartbeat), or
    None while a deaf spell's grace runs (detect nothing)."""
    now = now or timezone.now()
    timeout = timedelta(seconds=timeout_s)
    watch, _ = HeartbeatWatch.objects.select_for_update().get_or_create(key="heartbeats")
    beats = sorted((at for at in Instance.objects.filter(state__in=(InstanceState.RUNNING, InstanceState.NOTICE))
                    .values_list("last_heartbeat_at", flat=True) if at is not None), reverse=True)
    live = Instance.objects.filter(state__in=(InstanceState.RUNNING, InstanceState.NOTICE)).count()
    majority = live // 2 + 1
    # A web server shutting down still serves some nodes on kept-alive connections for a while:
    # their heartbeats do not prove that the others could have been heard.
    majority_heard = beats[majority - 1] if len(beats) >= majority else None
    detector_stalled = watch.last_run_at is not None and now - watch.last_run_at > timeout
    most_unheard = live > 0 and (majority_heard is None or now - majority_heard > timeout)
    if detector_stalled or most_unheard:
        watch.deaf_until = now
    watch.last_run_at = now
    watch.save(update_fields=["last_run_at", "deaf_until"])
    if watch.deaf_until is not None and now - watch.deaf_until <= timeout:
        return None
    return min(now, majority_heard) if majority_heard is not None else now
