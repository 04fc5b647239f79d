"""Reacting to interruption notices: a worker's drain claims stored notices (fleet's
`fleet.notices.claims`) and processes them in batches (`processing`), each notice moving its
instance, recording the event on its job's timeline and deciding a reconfiguration (`reaction`),
which orchestration applies once the batch commits (`services.generations`)."""

from controlplane.orchestration.notices.processing import (
    DrainResult,
    notice_process,
    notices_drain,
    notices_process_batch,
    notices_sweep,
)

__all__ = ["DrainResult", "notice_process", "notices_drain", "notices_process_batch", "notices_sweep"]
