"""The local provider's catalogue: the instance type, zones and region of nodes that run as processes
on this host (`orchestration/providers/local/`), and the cloud type they stand in for when priced."""

from __future__ import annotations

LOCAL_INSTANCE_TYPE = "local.node"
LOCAL_ZONE = "local"
LOCAL_ZONES = (LOCAL_ZONE, "local-b", "local-c", "local-d")
"""Zones a local plan may name: one host, but several pools, so failover between pools can be tried
(and scripted, `SPOTPIPE_LOCAL_CAPACITY`) without a cloud."""
LOCAL_REGION = "local"
LOCAL_STAND_IN_TYPE = "g4dn.xlarge"
"""The cloud type a local node stands in for: the demo prices the local pool with its history, and the
planner prices an unpriced local pool at its typical spot price, so plans over local nodes have real
costs (not ties at zero)."""
