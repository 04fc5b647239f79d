"""A thread pool whose threads query the database, and close their connections when it shuts down.

Django keeps one connection per thread (persistent up to CONN_MAX_AGE), and nothing closes a pool
thread's connection when the pool ends: an app of the ASGI server that was shut down, or the many
that the tests build, left its threads' PostgreSQL sessions open until the process exited (the
PostgreSQL pass's test databases could not be dropped: "being accessed by other users").
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connections

CLOSE_WAIT_S = 5.0
"""How long a shutdown waits for the pool's threads to take their close (a thread busy longer keeps
its connection until the process exits)."""


class DatabaseThreadPool(ThreadPoolExecutor):
    """`ThreadPoolExecutor` whose `shutdown` first closes each started thread's database connections."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._threads_started = 0
        self._count_lock = threading.Lock()
        self._connections_closed = False
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix,
                         initializer=self._count_thread)

    def _count_thread(self) -> None:
        with self._count_lock:
            self._threads_started += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._count_lock:
            threads, self._connections_closed = (0 if self._connections_closed else self._threads_started), True
        if threads:
            # One close per thread: the barrier holds each task until every thread has one.
            barrier = threading.Barrier(threads, timeout=CLOSE_WAIT_S)
            closes = [self.submit(_close_connections_after, barrier) for _ in range(threads)]
            concurrent.futures.wait(closes, timeout=CLOSE_WAIT_S + 1)
        super().shutdown(wait, cancel_futures=cancel_futures)


def _close_connections_after(barrier: threading.Barrier) -> None:
    # A broken barrier: a thread stayed busy; the others still close theirs.
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    connections.close_all()


def in_request(fn: Callable, *args: Any) -> Any:
    """`fn(*args)` in a pool thread with Django's per-request connection hygiene."""
    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()
