"""What a worker's exit code means: the contract between the worker (`agent/worker_entry.py`), its
agent (which restarts a crashed worker and reports every exit) and the control plane (which counts
crashes against `max_restarts_on_errors`). Plain constants: no torch, no Django."""

from __future__ import annotations

EXIT_FENCED = 3
"""The job dropped this worker (declared gone while it was hung): restarting it as it was would only
be dropped again."""
EXIT_JOB_FAILED = 4
"""The runtime found that the job cannot go on (an impossible plan, data or a model that cannot
run): reported with the reason, never restarted."""
NOT_CRASHES = frozenset({0, EXIT_FENCED, EXIT_JOB_FAILED})
"""Exit codes that are not a crash of the job's code (a preempted node's worker reports no exit)."""
