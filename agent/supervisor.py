"""Starts and supervises this node's runtime worker, and hands it new generations.

Protocol with the worker process (`python -m <worker module> --spec SPEC --control CONTROL`):
- SPEC (JSON, written once): job, model spec, plan, the generation, this node's assignment and
  `device_index` (the agent's `--gpu-index`: the GPU a `cuda` job uses on this VM).
- CONTROL (JSON, rewritten atomically by the agent): the newest generation. The worker reads it at
  every iteration boundary and switches to it there; a worker that is not a member of the new
  generation finishes its iteration and exits 0 (a graceful leave).
- stdout lines `SPOTPIPE {json}`: `{"type": "metrics", ...}` per step, `{"type": "generation", ...}`
  when it switched, `{"type": "done", ...}` when the job's steps are done.

No orphans: the worker runs in the agent's process group (a node kill takes it too), gets SIGKILL
if the agent dies (PR_SET_PDEATHSIG), and `stop()` terminates it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.command import AgentCommand

logger = logging.getLogger("spotpipe.agent")

MARKER = "SPOTPIPE "
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the agent dies (Linux)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class WorkerSupervisor:
    """One runtime worker at a time (one rank per node). `on_message(dict)` receives the worker's
    `SPOTPIPE` lines; `on_exit(code, deliberate)` is called when the worker ends
    (deliberate: `stop()` ended it)."""

    def __init__(self, work_dir: Path, *, worker_module: str = "agent.worker_entry", python: str | None = None,
                 on_message: Callable[[dict], None] | None = None, on_exit: Callable[[int, bool], None] | None = None,
                 stop_grace_s: float = 5.0, gpu_index: int = 0) -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.worker_module = worker_module
        self.python = python or sys.executable
        self.on_message = on_message or (lambda message: None)
        self.on_exit = on_exit or (lambda code, deliberate: None)
        self.stop_grace_s = stop_grace_s
        self.gpu_index = gpu_index
        """The GPU of this VM a `cuda` job's worker uses (`CUDA_VISIBLE_DEVICES` numbering)."""
        self.proc: subprocess.Popen | None = None
        self.generation: int | None = None
        self.job_id: int | None = None
        self._lock = threading.RLock()
        self._reader: threading.Thread | None = None

    @property
    def control_path(self) -> Path:
        return self.work_dir / "control.json"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def needs_start(self, command: AgentCommand) -> bool:
        """Whether `apply(command)` would start a worker (none runs for the command's job)."""
        with self._lock:
            return not (self.running() and self.job_id == command.job.id)

    def apply(self, command: AgentCommand, *, python: str | None = None) -> str:
        """Act on a `run` command: hand a new generation to the running worker of the same job, or
        start a worker (on `python`: the job's virtualenv's, default the supervisor's). Returns what
        it did: `started`, `handed`, `unchanged`."""
        generation = command.generation
        with self._lock:
            if self.running() and self.job_id == command.job.id:
                if self.generation == generation.number:
                    return "unchanged"
                write_json_atomic(self.control_path, generation.to_dict())
                self.generation = generation.number
                return "handed"
            self.stop()
            self._start(command, python=python or self.python)
            return "started"

    def hand_over(self, command: AgentCommand) -> bool:
        """Give a non-member (standby) answer's generation to the running worker so it leaves at
        its next iteration boundary. False when no worker runs."""
        with self._lock:
            if not self.running() or command.generation is None:
                return False
            write_json_atomic(self.control_path, command.generation.to_dict())
            self.generation = command.generation.number
            return True

    def stop_path(self, job_id: int) -> Path:
        """The file whose presence asks job `job_id`'s worker to checkpoint and stop (its watcher
        tells the runtime, whose members agree on the step)."""
        return self.work_dir / f"stop-{job_id}"

    def request_stop(self, job_id: int) -> bool:
        """Ask the running worker of `job_id` to checkpoint and stop. False when none runs."""
        with self._lock:
            self.stop_path(job_id).touch()
            return self.running() and self.job_id == job_id

    def log_tail(self, lines: int) -> list[str]:
        """The last `lines` lines of the worker's log (its stderr: a crash's traceback)."""
        path = self.work_dir / "worker.log"
        try:
            with open(path, "rb") as log:
                log.seek(max(0, path.stat().st_size - 64 * 1024))
                text = log.read().decode(errors="replace")
        except OSError:
            return []
        return [line[:500] for line in text.splitlines()[-lines:]]

    def _start(self, command: AgentCommand, *, python: str) -> None:
        generation = command.generation.to_dict()
        spec = {"job": command.job.to_dict(), "generation": generation, "assignment": command.assignment,
                "instance": command.instance, "work_dir": str(self.work_dir), "device_index": self.gpu_index}
        self.stop_path(command.job.id).unlink(missing_ok=True)  # a stop asked of an earlier run
        spec_path = self.work_dir / f"spec-{generation['number']}.json"
        write_json_atomic(spec_path, spec)
        write_json_atomic(self.control_path, generation)
        argv = [python, "-m", self.worker_module, "--spec", str(spec_path), "--control", str(self.control_path)]
        log = open(self.work_dir / "worker.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                         preexec_fn=_die_with_parent, cwd=os.getcwd(), env={**os.environ,
                                         "PYTHONUNBUFFERED": "1"})
        finally:
            log.close()
        self.generation = generation["number"]
        self.job_id = command.job.id
        self._reader = threading.Thread(target=self._read, args=(self.proc,), name="worker-stdout", daemon=True)
        self._reader.start()
        logger.info("started worker pid %s for job %s generation %s", self.proc.pid, self.job_id, self.generation)

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(MARKER):
                try:
                    self.on_message(json.loads(line[len(MARKER):]))
                except ValueError:
                    logger.warning("bad worker message: %s", line[:200])
                except Exception:
                    logger.exception("handling worker message failed")
        code = proc.wait()
        logger.info("worker pid %s exited with %s", proc.pid, code)
        with self._lock:
            deliberate = self.proc is not proc  # stop() already let go of it
            if not deliberate:
                self.proc = None
                self.generation = None
        self.on_exit(code, deliberate)

    def stop(self) -> None:
        """Terminate the worker (SIGTERM, SIGKILL after the grace period) and wait for it."""
        with self._lock:
            proc, self.proc = self.proc, None
            self.generation = None
            self.job_id = None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
