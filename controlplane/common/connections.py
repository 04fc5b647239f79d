"""Drop database connections that the driver reports closed but Django still holds.

After a PostgreSQL restart (the chaos soak's `postgres` fault), a Celery worker process was seen
failing every task with `OperationalError('the connection is closed')` until the end of the run:
Django kept a psycopg connection that psycopg itself reported closed, and Celery's per-task
`close()` did not let it go. Each task now starts by dropping such a connection (and the
transaction state tied to it), so the next query reconnects."""

from __future__ import annotations

import logging

from django.db import connections

logger = logging.getLogger(__name__)


def drop_broken_connections() -> list[str]:
    """Forget every initialized connection whose driver connection is closed or broken; returns
    their aliases. Call it where no transaction can legitimately be open (before a task): the
    atomic-block state of a dead connection goes with it."""
    dropped = []
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None or not getattr(raw, "closed", False):
            continue
        logger.warning("dropping broken database connection %s (closed_in_transaction=%s, in_atomic_block=%s, "
                       "needs_rollback=%s)", conn.alias, conn.closed_in_transaction, conn.in_atomic_block,
                       conn.needs_rollback)
        conn.connection = None
        conn.closed_in_transaction = False
        conn.in_atomic_block = False
        conn.savepoint_ids = []
        conn.atomic_blocks = []
        conn.needs_rollback = False
        conn.run_on_commit = []
        dropped.append(conn.alias)
    return dropped
