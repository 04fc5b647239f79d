"""Interruption notices, fleet's side: store first (one idempotent insert), hand stored notices to
workers in batches (an outbox), and claim them for a worker. What a notice does (move its instance,
decide a reconfiguration) is orchestration's: `controlplane.orchestration.notices`.

Why an outbox: publishing one Celery message per notice costs more CPU than the insert itself
(`python -m bench webhooks`, docs/webhooks.md), so the web request only inserts and *kicks*; a
per-process kicker coalesces kicks into at most one `drain_notices` publish per window, and the
drain task claims `received` rows in batches. The first notice after a quiet period is published at
once (leading edge); those that arrive during the window are covered by one trailing publish. A
periodic sweep re-kicks whatever was stored but never processed (worker or broker down).

The package, by job: `store` (the insert), `handoff` (the outbox's kicks and drain pacing, and the
notice tasks' names), `claims` (claiming, marking, requeueing, an operator's retry). Their tunables
are in controlplane/tunables.py."""

from controlplane.fleet.notices.claims import (
    CLAIM_STALE_AFTER,
    MAX_ATTEMPTS,
    notice_record_failure,
    notice_retry,
    notices_claim,
    notices_requeue_stale,
)
from controlplane.fleet.notices.handoff import drain_pace, drain_started, notices_handoff
from controlplane.fleet.notices.store import NoticeDraft, StoreResult, notices_store

__all__ = [
    "CLAIM_STALE_AFTER",
    "MAX_ATTEMPTS",
    "NoticeDraft",
    "StoreResult",
    "drain_pace",
    "drain_started",
    "notice_record_failure",
    "notice_retry",
    "notices_claim",
    "notices_handoff",
    "notices_requeue_stale",
    "notices_store",
]
