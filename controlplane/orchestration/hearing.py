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
  heartbeat until the control plane has been listening again for a whole timeout.

Nodes that die together (half of them or more, or the only node) are then left to the provider's
view (`capacity_reconcile` asks the provider every few seconds and marks the nodes it reports gone)
and to their notices, not to heartbeats."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.orchestration.models import HeartbeatWatch


@transaction.atomic
def heartbeats_audible(*, timeout_s: float, now: datetime | None = None) -> bool:
    """Record this run of the detector; True when heartbeat silence can be trusted now."""
    now = now or timezone.now()
    timeout = timedelta(seconds=timeout_s)
    watch, _ = HeartbeatWatch.objects.select_for_update().get_or_create(key="heartbeats")
    counts = Instance.objects.filter(state__in=(InstanceState.RUNNING, InstanceState.NOTICE)).aggregate(
        live=Count("pk"), heard=Count("pk", filter=Q(last_heartbeat_at__gte=now - timeout)))
    detector_stalled = watch.last_run_at is not None and now - watch.last_run_at > timeout
    most_unheard = counts["live"] > 0 and 2 * counts["heard"] <= counts["live"]
    if detector_stalled or most_unheard:
        watch.deaf_until = now
    watch.last_run_at = now
    watch.save(update_fields=["last_run_at", "deaf_until"])
    return watch.deaf_until is None or now - watch.deaf_until > timeout
