"""A connection the driver reports closed is dropped before a task (`common.connections`), so a
Celery worker process recovers after a database restart (found by the chaos soak)."""

from __future__ import annotations

import pytest
from django.db import connection

from controlplane.common.connections import drop_broken_connections


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server restart breaks PostgreSQL connections; SQLite "
                    "has no server (the suite's PostgreSQL pass runs this)")
@pytest.mark.django_db(transaction=True)
def test_a_closed_driver_connection_is_dropped_and_the_next_query_reconnects():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert drop_broken_connections() == []  # a healthy connection is kept
    kept = connection.connection
    kept.close()  # what a server restart leaves behind, as the driver sees it
    connection.closed_in_transaction = True  # and Django's close() would now do nothing
    assert drop_broken_connections() == ["default"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone()[0] == 1
    assert connection.connection is not kept
