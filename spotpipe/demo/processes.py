"""Start and stop the long-running processes of a local stack (web server, Celery worker, beat),
each in its own process group, and make sure nothing outlives the demo.

Every process the demo starts gets `SPOTPIPE_DEMO_VAR_DIR=<the demo's var dir>` in its environment
(the demo itself and its parents do not have it), and so do their children (the local provider's
nodes, their agents and runtime workers, the rendezvous store), which inherit it.
`stray_pids(var_dir)` finds them all by that mark, whoever started them and whatever process group
they moved to; `sweep` ends them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def start(args: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `python <args>` from the repository root in a new session, logging to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True,
        )


# Requests in flight per web worker (granian's `--backpressure`; its default is backlog / workers,
# 341 with 3 workers): every agent holds a command long-poll (no thread, but a request in flight),
# and a worker that reached the limit accepts nothing more, heartbeats and webhooks included (seen
# with 1,024 agents: `python -m bench fleet`). The accept backlog is as deep.
IN_FLIGHT_PER_WORKER = 4096


AGENT_SERVER_WORKERS = 1
"""Workers of the agent channel's own web server (docker-compose's `agents` service; `python -m
bench fleet --agent-server own`): nodes reach the control plane there (`SPOTPIPE_PUBLIC_URL`), so a
fleet's heartbeats, command long-polls and notices run in processes of their own and never share a
worker's interpreter lock or view threads with webhooks and the dashboard (docs/orchestration.md,
"The agent channel's own server"). It is the same application: any path works on either server."""


def granian_args(*, host: str, port: int, workers: int, kill_timeout_s: int = 3) -> list[str]:
    """`python -m granian ...` arguments for the control plane's ASGI application
    (`controlplane.asgi`): the product's web server (docker-compose, `spotpipe`'s local stacks, the
    benchmarks). Why granian and not gunicorn: it parses HTTP in Rust, which halved the web
    server's CPU per webhook notice (docs/webhooks.md, "Measured"). Why ASGI: agents' command
    long-polls are held on each worker's event loop, not in a thread (docs/orchestration.md, "The
    agent command channel"); every other request runs in one of a worker's `web_threads_env`
    threads for its whole duration."""
    return ["-m", "granian", "--interface", "asgi", "--host", host, "--port", str(port),
            "--workers", str(workers), "--backlog", str(IN_FLIGHT_PER_WORKER),
            "--backpressure", str(IN_FLIGHT_PER_WORKER), "--no-ws", "--workers-kill-timeout", str(kill_timeout_s),
            "--log-level", "warning", "controlplane.asgi:application"]


def web_threads_env(threads: int) -> dict[str, str]:
    """The environment that gives each web worker `threads` threads for the WSGI views."""
    return {"SPOTPIPE_WEB_THREADS": str(threads)}


def stop(proc: subprocess.Popen, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left of it after `timeout` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _environ_has(pid: int, mark: bytes) -> bool:
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return True


MARK = "SPOTPIPE_DEMO_VAR_DIR"


def _ancestors() -> set[int]:
    pids = set()
    pid = os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
            break
    return pids


def stray_pids(var_dir: Path) -> list[int]:
    """Live processes (not this one nor its parents) marked as started for the demo of `var_dir`."""
    mark = f"{MARK}={Path(var_dir).resolve()}".encode()
    spared = _ancestors()
    pids = []
    for entry in Path("/proc").iterdir():
        pid = int(entry.name) if entry.name.isdigit() else os.getpid()
        if pid not in spared and _environ_has(pid, mark) and not _is_zombie(pid):
            pids.append(pid)
    return sorted(pids)


def sweep(var_dir: Path, *, grace_s: float = 3.0) -> list[int]:
    """SIGTERM every stray process of `var_dir`, SIGKILL those still there after `grace_s`.
    Returns the pids that had to be ended."""
    pids = stray_pids(var_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and stray_pids(var_dir):
        time.sleep(0.1)
    killed = stray_pids(var_dir)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    # A SIGKILLed process still runs for a moment while it exits: return once it is gone, so that
    # "everything stopped" is true when the demo says it (and a check right after finds nothing).
    deadline = time.monotonic() + 5.0
    while killed and stray_pids(var_dir) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


@dataclass
class Stack:
    """The web server, a Celery worker and Celery beat of one var dir, started and stopped together."""

    var_dir: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.var_dir / "logs"

    def _start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> None:
        var_dir = str(self.var_dir.resolve())
        env = {**self.env, "SPOTPIPE_VAR_DIR": var_dir, MARK: var_dir, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        # The local nodes the worker starts carry the mark too, so that `sweep` finds them: they get
        # only the variables named for them (controlplane/orchestration/providers/local/environment.py).
        named = env.get("SPOTPIPE_LOCAL_NODE_ENV", "")
        env["SPOTPIPE_LOCAL_NODE_ENV"] = f"{named},{MARK}" if named.strip() else MARK
        self.procs[name] = start(args, log_path=self.log_dir / f"{name}.log", env=env)

    def start_web(self, *, host: str, port: int) -> None:
        self._start("web", ["manage.py", "runserver", f"{host}:{port}", "--noreload", "--skip-checks"])

    def start_granian(self, *, host: str, port: int, workers: int = 2, threads: int = 24) -> None:
        """The production web server (as docker-compose runs it): granian's ASGI workers, each with
        `threads` threads for the views (agents' held long-polls take none), and a short kill
        timeout so that a restart does not wait for long-polls."""
        self._start("web", granian_args(host=host, port=port, workers=workers), web_threads_env(threads))

    def start_worker(self, *, concurrency: int = 3) -> None:
        # A node name of its own: on a shared Redis, other workers must not be mistaken for ours.
        self._start("worker", ["-m", "celery", "-A", "controlplane", "worker", "--loglevel=INFO",
                               f"--concurrency={concurrency}", "--without-gossip", "--without-mingle",
                               f"--hostname=spotpipe-demo-{os.getpid()}@%h"])

    def start_beat(self) -> None:
        self._start("beat", ["-m", "celery", "-A", "controlplane", "beat", "--loglevel=INFO",
                             f"--pidfile={self.var_dir / 'beat.pid'}",
                             f"--schedule={self.var_dir / 'celerybeat-schedule'}"])

    def exited(self) -> list[str]:
        """Names of the processes that are no longer running."""
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def stop(self) -> None:
        """Beat first (no new periodic work), then the worker, then the web server."""
        for name in ("beat", "worker", "web"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                # The worker may be in a launch (seconds): what it leaves, the demo's sweep ends.
                stop(proc, timeout=5.0)
