"""The outbox's hand-over: coalesced kicks publish at most one `drain_notices` per window, a shared
"drain pending" flag keeps at most one queued, and drains are paced (see the package docstring)."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from django.conf import settings

from controlplane.tunables import tunable

logger = logging.getLogger(__name__)


# The notice tasks' names (their wire identity: queued messages and beat's database rows carry them).
# The tasks react, so they live in orchestration (`orchestration/tasks.py`); fleet publishes them by
# name, through the app's registry, and so never imports orchestration.
DRAIN_TASK = "fleet.drain_notices"
SWEEP_TASK = "fleet.sweep_notices"
PROCESS_TASK = "fleet.process_notice"


def _task(name: str) -> Any:
    from controlplane.celery import app

    return app.tasks[name]


DRAIN_PENDING_KEY = "spotpipe:notices:drain-pending:{queue}"
DRAIN_PENDING_TTL_S = 30
_pending_client: tuple[int, Any] | None = None


def _pending_store() -> Any:
    """A Redis client on the broker's Redis (one per process), or None on the embedded broker.

    It holds one flag, "a drain is queued and has not started", shared by every web process and
    worker, so that at most one `drain_notices` waits in the queue however many kicks arrive."""
    global _pending_client
    url = getattr(settings, "CELERY_BROKER_URL", "") or ""
    if not url.startswith(("redis://", "rediss://")):
        return None
    if _pending_client is None or _pending_client[0] != os.getpid():
        import redis

        _pending_client = (os.getpid(), redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1))
    return _pending_client[1]


def _queue() -> str:
    from controlplane.celery import app

    return app.conf.task_default_queue or "celery"


def _pending_key() -> str:
    """The flag is per queue: it means "a drain is waiting in *this* queue"."""
    return DRAIN_PENDING_KEY.format(queue=_queue())


def _publish_drain() -> bool:
    """Ask a worker to drain stored notices, unless a drain is already queued and not yet started
    (it will claim after our commit, so it covers our rows). Returns whether it published."""
    client = _pending_store()
    if client is not None:
        try:
            if not client.set(_pending_key(), "1", nx=True, ex=DRAIN_PENDING_TTL_S):
                return False
        except Exception:  # Redis unreachable: publish anyway (extra drains are harmless)
            logger.warning("drain-pending flag unavailable; publishing without it", exc_info=True)
            client = None
    try:
        _task(DRAIN_TASK).delay()
    except Exception:
        if client is not None:
            client.delete(_pending_key())  # let the next kick try again
        raise
    return True


DRAIN_LAST_START_KEY = "spotpipe:notices:drain-last-start:{queue}"
_last_drain_start = 0.0  # without Redis (embedded broker): this worker process's own last start


def drain_pace() -> None:
    """Called by a drain before it clears the pending flag and claims: if the previous drain
    started less than the spacing ago, wait out the rest.

    Why: a batch costs the same statements for 1 or 200 notices. Unpaced, drains run back to back
    during a burst, each claiming what arrived while the previous one ran (a few dozen notices),
    and the worker's CPU per notice tripled in the bench (0.38 ms with big batches, 0.7-1.1 ms with
    small ones), CPU the web server needed for ingest. Paced, a burst is processed in batches that
    grow with the arrival rate. The first drain after a quiet spell does not wait, so a lone notice
    still reacts within milliseconds; under a burst a reaction waits at most one spacing more.
    Kicks during the wait publish nothing: the pending flag is still set and this drain claims
    after their commits."""
    global _last_drain_start
    spacing = tunable("SPOTPIPE_NOTICE_DRAIN_SPACING_S")
    if spacing <= 0:
        return
    client = _pending_store()
    key = DRAIN_LAST_START_KEY.format(queue=_queue())
    last = _last_drain_start
    if client is not None:
        try:
            last = float(client.get(key) or 0.0)
        except Exception:  # Redis unreachable: pace on this process's own record
            client = None
    wait = last + spacing - time.time()
    if wait > 0:
        time.sleep(min(wait, spacing))
    _last_drain_start = time.time()
    if client is not None:
        try:
            client.set(key, repr(_last_drain_start), ex=60)
        except Exception:
            logger.warning("could not record the drain start; pacing on this process's own record")


def drain_started() -> None:
    """Called by a drain before it claims: from now on a new kick must queue another drain."""
    client = _pending_store()
    if client is not None:
        try:
            client.delete(_pending_key())
        except Exception:
            logger.warning("could not clear the drain-pending flag; it expires in %d s", DRAIN_PENDING_TTL_S)


class _Kicker:
    """Coalesces kicks into at most one `drain_notices` publish per window, per process, off the
    request path: a daemon thread publishes at once when idle (leading edge), then sleeps for the
    window; kicks that arrive meanwhile are covered by the next publish (trailing edge). Every kick
    is therefore followed by a publish that starts after it, so no committed notice waits for the
    sweep unless the broker is down. On Redis, a shared "drain pending" flag also skips the publish
    while a drain is queued and not yet started, so kicks never pile up behind a busy worker."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self.publishes = 0

    def kick(self) -> None:
        self._ensure_thread()
        self._wake.set()

    def _ensure_thread(self) -> None:
        # A forked child (gunicorn worker) inherits the object but not the thread.
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
                return
            self._wake = threading.Event()
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="notice-kicker", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                if _publish_drain():
                    self.publishes += 1
            except Exception:  # the broker is down: the rows are stored, the sweep will find them
                logger.exception("could not publish drain_notices; the periodic sweep will retry")
            time.sleep(tunable("SPOTPIPE_NOTICE_KICK_WINDOW_S"))


_kicker = _Kicker()


def notices_handoff(*, notice_ids: list[int]) -> None:
    """Tell workers that notices were stored (called on commit of the insert)."""
    mode = tunable("SPOTPIPE_NOTICE_HANDOFF")
    if mode == "none":
        return
    if mode == "per_request":
        for notice_id in notice_ids:
            try:
                _task(PROCESS_TASK).delay(notice_id)
            except Exception:
                logger.exception("could not publish process_notice(%s); the sweep will retry", notice_id)
        return
    _kicker.kick()
