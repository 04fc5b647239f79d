"""Orchestration: acquire and release spot capacity for jobs, keep it at the plan's size, and turn
nodes leaving or joining into new generations of the job.

Every function here is safe to run twice: acquisitions are keyed by a request token decided under
the job's row lock; providers adopt what an earlier launch with the same token started; a
reconfiguration is applied once (its status moves from `decided` to `applied` under the job lock).
Provider calls (network, seconds) run outside database transactions.

One module per job, each importing what it needs from the others:

- `acquisition`: record a job's missing capacity, launch it, attach the launched nodes;
- `agents`: a node's enrolment, its agent's commands and notices;
- `agent_events`: what an agent reports of its workers, acted on once per event;
- `generations`: the next generation when nodes join or leave, and when a decided leave is applied
  (after its decider's commit; inline in a worker, else by a task);
- `liveness`: nodes whose heartbeats stopped, or that never enrolled, are lost;
- `job_end`: a job fails or finishes;
- `reconcile`: desired against actual capacity, and an ended job's release;
- `transitions`, `catalogue`, `enrolment_keys`: what those share (status and state moves, catalogue
  rows for provider answers, enrolment keys).

This package re-exports their public functions, so `from controlplane.orchestration.services import
capacity_reconcile` keeps working. A test that replaces one of them must patch the module where the
caller looks it up: the submodule for a caller in this package (`acquisition.acquisition_attach` for
`acquisition_launch`), this package for a caller that calls `services.<name>` (the agent API views).
"""

from __future__ import annotations

from controlplane.orchestration.services.acquisition import (
    LAUNCH_STALE_AFTER,
    acquisition_attach,
    acquisition_launch,
    capacity_request,
    control_plane_url,
    job_start,
)
from controlplane.orchestration.services.agent_events import agent_event
from controlplane.orchestration.services.agents import (
    agent_commands,
    agent_commands_many,
    agent_enroll,
    agent_notice,
)
from controlplane.orchestration.services.enrolment_keys import acquisition_enroll_key, acquisition_from_enroll_key
from controlplane.orchestration.services.generations import (
    job_grow,
    reconfiguration_apply,
    reconfiguration_lost_seconds,
    reconfigurations_apply,
    reconfigurations_apply_after_commit,
    reconfigurations_pending,
)
from controlplane.orchestration.services.job_end import (
    FINISH_GRACE,
    job_fail,
    job_fail_if_stalled,
    job_finish,
    job_stall_timeout_s,
    requirements_failed_report,
    worker_exit_report,
)
from controlplane.orchestration.services.liveness import (
    ENROLL_TIMEOUT,
    heartbeat_timeout_s,
    instance_mark_lost,
    instance_terminate,
    instances_detect_dead,
    instances_mark_lost,
)
from controlplane.orchestration.services.prepare import prepare_failed_report, share_claim, share_report
from controlplane.orchestration.services.profile import awaits_profile, job_profile_received, profile_failed_report
from controlplane.orchestration.services.reconcile import (
    active_job_ids,
    capacity_reconcile,
    capacity_release,
)

__all__ = [
    "ENROLL_TIMEOUT",
    "FINISH_GRACE",
    "LAUNCH_STALE_AFTER",
    "acquisition_attach",
    "acquisition_enroll_key",
    "acquisition_from_enroll_key",
    "acquisition_launch",
    "active_job_ids",
    "agent_commands",
    "agent_commands_many",
    "agent_enroll",
    "agent_event",
    "agent_notice",
    "awaits_profile",
    "capacity_reconcile",
    "capacity_release",
    "capacity_request",
    "control_plane_url",
    "heartbeat_timeout_s",
    "instance_mark_lost",
    "instance_terminate",
    "instances_detect_dead",
    "instances_mark_lost",
    "job_fail",
    "job_fail_if_stalled",
    "job_finish",
    "job_grow",
    "job_profile_received",
    "job_stall_timeout_s",
    "job_start",
    "prepare_failed_report",
    "profile_failed_report",
    "reconfiguration_apply",
    "reconfiguration_lost_seconds",
    "reconfigurations_apply",
    "reconfigurations_apply_after_commit",
    "reconfigurations_pending",
    "requirements_failed_report",
    "share_claim",
    "share_report",
    "worker_exit_report",
]
