"""Database connections in Celery worker processes, kept as healthy as in web requests.

Django checks a persistent connection (CONN_HEALTH_CHECKS) and drops a broken one at the start and
end of each request (`close_old_connections` on request_started/request_finished). Celery's Django
fixup only closes connections every 2 x CELERY_DB_REUSE_MAX tasks when that setting is on (it is:
reconnecting for every task costs more than the task), and nothing else resets Django's "health
checked" flag, so after a PostgreSQL restart a worker process kept its dead connection and failed
every task with `OperationalError('the connection is closed')` (found by the chaos soak,
`bench/chaos.py`). Tasks now get the request treatment: before and after each one, a connection
that failed or outlived CONN_MAX_AGE is closed, and the next query checks the connection first."""

from __future__ import annotations

from django.db import connections


def task_connections_checked(**_: object) -> None:
    """Celery `task_prerun`/`task_postrun` handler: Django's per-request connection upkeep.

    A connection inside an atomic block is left alone: the task then runs in its caller's
    transaction (`.apply()`, eager mode, a test), and closing it would break that transaction;
    Django's test client skips its request upkeep for the same reason."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()
