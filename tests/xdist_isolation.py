"""A pytest plugin (loaded with `-p tests.xdist_isolation`, before pytest-django sets Django up) that
gives each pytest-xdist worker its own var folder (SQLite file, filesystem broker, file cache, local
nodes) and its own Redis database, so two workers' Celery workers, brokers and rate-limit counts
never meet. The test databases themselves are per worker already (pytest-django adds `_gwN`).

It runs at import, in each worker process, because Django's settings read these variables once
when they are first imported; in a run without xdist it does nothing."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _worker_redis_url(url: str, offset: int) -> str:
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{db + offset}"))


if WORKER.startswith("gw"):
    index = int(WORKER[2:]) + 1  # gw0 -> 1: the run's own database (and db 0) stays the controller's
    var_dir = os.environ.get("SPOTPIPE_VAR_DIR") or os.path.join(os.getcwd(), "var")
    os.environ["SPOTPIPE_VAR_DIR"] = os.path.join(var_dir, f"xdist-{WORKER}")
    for key in ("REDIS_URL", "CELERY_BROKER_URL"):
        url = os.environ.get(key, "")
        if url.startswith(("redis://", "rediss://")):
            os.environ[key] = _worker_redis_url(url, index)
