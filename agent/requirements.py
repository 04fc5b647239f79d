"""A job's Python requirements (`config.requirements`), installed on the node before its runtime starts.

Into a per-job virtualenv under the agent's work dir (`<work_dir>/job-<id>/venv`), made with
`--system-site-packages` and a `.pth` naming the agent's own site-packages, so torch and spotpipe come
from the node's environment (even when the agent itself runs in a virtualenv) and what the job
installs shadows them only where it asks to. `upload:<sha256>` entries are downloaded from the control
plane with the agent's token, `s3://` ones with the node's AWS credentials; pip gets local paths for
those and the other specifiers as they are, one argument each (runtime/config.py refused options).

A job without requirements runs on the agent's own python, as before. A venv whose install finished
(its marker names the same requirements) is reused: a worker restarted after a crash does not install
again.
"""

from __future__ import annotations

import collections
import json
import site
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runtime.config import UPLOAD_PREFIX

MARKER = ".spotpipe-requirements.json"
STREAMED_LINES = 200
"""The most installer lines sent to the job's events per install (the whole output is in pip.log)."""
REASON_CHARS = 280
"""How much of pip's last lines a failure's reason keeps (a job event's message is 300 characters)."""


class InstallFailed(Exception):
    """The job's requirements cannot be installed on this node; `reason` ends with pip's last lines."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def job_requirements(config: Mapping[str, Any]) -> list[str]:
    """The requirements a job's contract (`JobConfig.to_dict()`) lists."""
    return list(config.get("requirements") or [])


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _create_venv(venv: Path) -> None:
    """A venv over the node's environment. Without pip of its own when the agent's python has one
    (the `.pth` makes it importable there; ensurepip takes seconds), else with ensurepip."""
    import importlib.util

    has_pip = importlib.util.find_spec("pip") is not None
    argv = [sys.executable, "-m", "venv", "--system-site-packages", *(["--without-pip"] if has_pip else []), str(venv)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InstallFailed(f"could not create the job's virtualenv: {(done.stderr or done.stdout)[-REASON_CHARS:]}")
    # `--system-site-packages` reaches the base interpreter's packages only; a .pth adds the agent's
    # (a virtualenv's), after the venv's own, so the job's installs come first.
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (venv / "lib" / version / "site-packages" / "_spotpipe_node_env.pth").write_text("\n".join(parents) + "\n")


def _pip_arguments(requirements: list[str], fetch: Callable[[str], Path]) -> list[str]:
    arguments = []
    for index, entry in enumerate(requirements):
        if entry.startswith((UPLOAD_PREFIX, "s3://")):
            try:
                arguments.append(str(fetch(entry)))
            except Exception as exc:
                raise InstallFailed(f"requirements[{index}] {entry}: could not download it: {exc}") from None
        else:
            arguments.append(entry)
    return arguments


def _reason(lines: collections.deque[str], code: int) -> str:
    """pip's last lines, its `ERROR:` lines only when it printed some (they say what went wrong)."""
    errors = [line.strip() for line in lines if line.startswith("ERROR:")]
    tail = " | ".join(errors or [line.strip() for line in lines if line.strip()])
    return f"pip install exited with {code}: {tail[-REASON_CHARS:]}"


def _run_pip(python: Path, arguments: list[str], *, log_path: Path, on_line: Callable[[str], None],
             stop: threading.Event | None) -> None:
    argv = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--progress-bar",
            "off", *arguments]
    last: collections.deque[str] = collections.deque(maxlen=8)
    streamed, finished = 0, False
    with log_path.open("w") as log, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                     stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                last.append(line)
                if streamed < STREAMED_LINES:
                    streamed += 1
                    on_line(line if streamed < STREAMED_LINES else f"... the rest is in {log_path}")
                if stop is not None and stop.is_set():
                    break
            else:
                finished = True
        finally:
            if not finished and proc.poll() is None:  # stopping, or the agent is going: no orphan pip
                proc.kill()
            code = proc.wait()
    if stop is not None and stop.is_set():
        raise InstallFailed("the agent is stopping")
    if code != 0:
        raise InstallFailed(_reason(last, code))


def job_python(job_id: int, config: Mapping[str, Any], *, work_dir: Path, fetch: Callable[[str], Path],
               on_line: Callable[[str], None], stop: threading.Event | None = None) -> str:
    """The python the job's runtime runs on: the agent's own without requirements, else the job's
    venv with them installed (installing now unless an earlier install of the same list finished).
    `fetch(entry)` downloads an `upload:`/`s3://` entry and returns its local path; `on_line` gets
    the installer's output lines. Raises `InstallFailed`."""
    requirements = job_requirements(config)
    if not requirements:
        return sys.executable
    venv = Path(work_dir) / f"job-{job_id}" / "venv"
    python, marker = venv_python(venv), venv / MARKER
    wanted = json.dumps(requirements)
    if python.exists() and marker.is_file() and marker.read_text() == wanted:
        return str(python)
    arguments = _pip_arguments(requirements, fetch)  # first: an unknown upload fails before any venv is made
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        _create_venv(venv)
    marker.unlink(missing_ok=True)
    _run_pip(python, arguments, log_path=venv.parent / "pip.log", on_line=on_line, stop=stop)
    marker.write_text(wanted)
    return str(python)
