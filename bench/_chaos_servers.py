"""Private PostgreSQL and Redis servers for the chaos soak (`bench/chaos.py`): their own data in
the soak's var dir, on free ports of 127.0.0.1, so that restarting them disturbs nothing else on
the machine. PostgreSQL runs as the `postgres` user when we are root (it refuses to run as root)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from spotpipe.demo.processes import MARK


class MissingBinary(RuntimeError):
    """A server binary the soak needs is not installed."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _find(name: str, *, hint: str) -> str:
    candidates = [shutil.which(name), f"/usr/local/bin/{name}", *sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise MissingBinary(f"`{name}` not found (looked on PATH, /usr/local/bin, /usr/lib/postgresql/*/bin); {hint}")


POSTGRES_HINT = "install PostgreSQL's server (Debian: apt-get install postgresql)"
REDIS_HINT = "install Redis (Debian: apt-get install redis-server)"


def missing_binaries() -> list[str]:
    """The server binaries the soak needs and cannot find, each with how to install it."""
    missing = []
    for name, hint in (("initdb", POSTGRES_HINT), ("pg_ctl", POSTGRES_HINT), ("redis-server", REDIS_HINT)):
        try:
            _find(name, hint=hint)
        except MissingBinary as exc:
            missing.append(str(exc))
    return missing


def _server_env() -> dict[str, str]:
    # The servers must not carry the stack's mark: the orphan check looks for marked processes.
    return {k: v for k, v in os.environ.items() if k != MARK}


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class PrivatePostgres:
    """A throw-away cluster in `root` (initdb, then pg_ctl start/stop/restart)."""

    def __init__(self, root: Path) -> None:
        self.initdb = _find("initdb", hint=POSTGRES_HINT)
        self.pg_ctl = _find("pg_ctl", hint=POSTGRES_HINT)
        self.root = root
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/spotpipe"

    def _run(self, args: list[str], *, timeout: float = 90) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        return subprocess.run([*prefix, *args], env=_server_env(), capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL, start_new_session=True)

    def init(self) -> None:
        self.stop()  # a cluster left by an interrupted run
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        result = self._run([self.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                            "--no-sync", "--no-instructions"])
        if result.returncode:
            raise RuntimeError(f"initdb failed: {result.stderr.strip() or result.stdout.strip()}")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        result = self._run([self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options,
                            "start"])
        if result.returncode:
            raise RuntimeError(f"pg_ctl start failed: {result.stderr.strip()}; see {self.log}")

    def stop(self, *, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run([self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def create_database(self, name: str = "spotpipe") -> None:
        import psycopg

        with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')


class PrivateRedis:
    """`redis-server` with no persistence: a restart loses every queued message, as a crash would."""

    def __init__(self, root: Path) -> None:
        self.binary = _find("redis-server", hint=REDIS_HINT)
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, timeout_s: float = 20.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / "redis.log").open("ab")
        with log:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.root), "--protected-mode", "no"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_server_env(),
                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not _port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start; see {self.root / 'redis.log'}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: whatever was queued is gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None
