"""Celery tasks get Django's per-request connection upkeep (`common.connections`), so a worker
process recovers from a PostgreSQL restart instead of failing every task (found by the chaos soak)."""

from __future__ import annotations

import pytest
from celery import signals
from django.db import connection

from controlplane.common.connections import task_connections_checked


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server restart breaks PostgreSQL connections; SQLite "
                    "has no server (the suite's PostgreSQL pass runs this)")
@pytest.mark.django_db(transaction=True)
def test_a_connection_broken_between_tasks_is_replaced_before_the_next_query(settings):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.health_check_done = True  # as after the first task of a long-lived worker process
    kept = connection.connection
    kept.close()  # what a server restart leaves behind, as the driver sees it
    task_connections_checked()  # task_prerun
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone()[0] == 1
    assert connection.connection is not kept


def test_the_upkeep_runs_before_and_after_every_task():
    import controlplane.celery  # noqa: F401 - connects the handlers

    for signal in (signals.task_prerun, signals.task_postrun):
        assert task_connections_checked in [receiver for _key, receiver in signal.receivers]


@pytest.mark.django_db
def test_a_task_run_inside_its_callers_transaction_keeps_the_connection():
    # `.apply()` in a test (or eager mode) runs the task inside the caller's atomic block.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert connection.in_atomic_block
    task_connections_checked()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
