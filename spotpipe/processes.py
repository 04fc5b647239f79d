"""Start and stop the long-running processes of a local stack (web server, Celery worker, beat),
each in its own process group so that nothing outlives the parent."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def start(args: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `python -m <args>` from the repository root, logging to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `timeout` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
