"""`DatabaseThreadPool.shutdown` closes every pool thread's database connection (the ASGI server's
pools; before, each application the tests built left its threads' PostgreSQL sessions open)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from controlplane.fleet.models import Instance
from controlplane.hotpaths.thread_pools import DatabaseThreadPool

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 3


def _query_on_every_thread(pool: DatabaseThreadPool) -> list:
    """One query on each of the pool's THREADS threads; their connection wrappers."""
    barrier = threading.Barrier(THREADS, timeout=10)

    def query():
        barrier.wait()  # every task on its own thread
        Instance.objects.count()
        return connections["default"]

    wrappers = [f.result(timeout=20) for f in [pool.submit(query) for _ in range(THREADS)]]
    assert len({id(w) for w in wrappers}) == THREADS
    return wrappers


def _live_sessions(pids: set[int]) -> set[int]:
    """Which of these backend pids the server still lists."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
        return {row[0] for row in cursor.fetchall()}


def test_shutdown_closes_each_threads_connection():
    pool = DatabaseThreadPool(max_workers=THREADS, thread_name_prefix="test-pool")
    wrappers = _query_on_every_thread(pool)
    assert all(w.connection is not None for w in wrappers)
    pool.shutdown()
    assert all(w.connection is None for w in wrappers)
    pool.shutdown()  # a second shutdown is a no-op, not a submit to a closed pool


@pytest.mark.skipif(connection.vendor != "postgresql",
                    reason="reads the server's sessions (pg_stat_activity): SQLite has no server; the tests "
                           "beside it check the connections closed on both backends")
def test_shutdown_leaves_no_session_on_the_server():
    pool = DatabaseThreadPool(max_workers=THREADS, thread_name_prefix="test-pool")
    # The pool's own sessions, by backend pid: a count of every session on the database also
    # counted those of earlier tests still exiting, and failed when they left meanwhile.
    pids = {w.connection.info.backend_pid for w in _query_on_every_thread(pool)}
    assert len(pids) == THREADS and _live_sessions(pids) == pids
    pool.shutdown()
    # A backend leaves pg_stat_activity when its process has exited, a moment after the client
    # closed: on a loaded machine the list lagged the close (1 session for a few ms in CI).
    assert _sessions_left(pids) == set()


def _sessions_left(pids: set[int], *, bound_s: float = 10.0) -> set[int]:
    """Those of `pids` still listed once none is (or, past `bound_s`, those listed then)."""
    deadline = time.monotonic() + bound_s
    live = _live_sessions(pids)
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = _live_sessions(pids)
    return live


def test_a_control_plane_closes_both_pools():
    from controlplane.asgi import ControlPlane
    from controlplane.wsgi import application

    app = ControlPlane(application, redis_url="", web_threads=THREADS, agent_threads=THREADS)
    wrappers = _query_on_every_thread(app.agent_executor) + _query_on_every_thread(app.bridge.executor)
    app.close_pools()
    assert all(w.connection is None for w in wrappers)
