"""Liveness of the parts the control plane depends on: database, broker, Celery workers."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

# Each check is bounded so that /healthz answers within a few seconds even when a part hangs.
BROKER_TIMEOUT_S = 2.0
WORKER_PING_TIMEOUT_S = 1.0


@dataclass
class Check:
    ok: bool
    latency_ms: float
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _timed(fn) -> Check:
    start = time.perf_counter()
    try:
        detail, extra = fn()
        ok = True
    except Exception as exc:  # any failure is "not ok"; the class name and message are enough to act on
        ok, detail, extra = False, f"{type(exc).__name__}: {exc}"[:300], {}
    return Check(ok=ok, latency_ms=round((time.perf_counter() - start) * 1000, 2), detail=detail, extra=extra)


def check_database() -> Check:
    def run():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return connection.vendor, {}

    return _timed(run)


def check_broker() -> Check:
    def run():
        from kombu import Connection

        url = settings.CELERY_BROKER_URL
        with Connection(url, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
                        connect_timeout=BROKER_TIMEOUT_S) as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        # Never echo the URL: it may carry a password.
        return url.split("://", 1)[0], {}

    return _timed(run)


def check_workers(app=None) -> Check:
    """Ping the workers through `app` (the control plane's Celery app by default)."""

    def run():
        nonlocal app
        if app is None:
            from controlplane.celery import app
        replies = app.control.ping(timeout=WORKER_PING_TIMEOUT_S) or []
        names = sorted(name for reply in replies for name in reply)
        if not names:
            raise RuntimeError("no Celery worker answered a ping")
        return f"{len(names)} worker(s)", {"workers": names}

    return _timed(run)


CHECKS = {"database": check_database, "broker": check_broker, "workers": check_workers}


def health() -> tuple[bool, dict[str, Any]]:
    """(all ok, JSON body). The broker is checked before the workers: without it, pinging is moot."""
    results: dict[str, Any] = {}
    for name, check in CHECKS.items():
        if name == "workers" and not results["broker"]["ok"]:
            results[name] = asdict(Check(ok=False, latency_ms=0.0, detail="broker unreachable"))
            continue
        results[name] = asdict(check())
    failing = [name for name, r in results.items() if not r["ok"]]
    body = {"status": "ok" if not failing else "fail", "failing": failing, "checks": results}
    return not failing, body
