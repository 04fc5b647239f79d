"""A node's part of its job's prepare step (`config.data.prepare`): ask the control plane for a
share, prepare it with `python -m runtime.data.prepare_share` in the job's environment, report it,
and ask again until no share is left; a share whose data cannot be prepared fails the job."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from agent.json_lines import last_json_object

WAIT_FOR_SHARES_S = 30.0
"""How often a node with nothing to prepare asks again. A lost node's share is usually taken by its
replacement as it starts; the waiting nodes ask in case none comes (1,024 of them: about 34 asks a
second, each one unlocked read of the step's rows)."""


class PrepareFailed(Exception):
    """The share could not be prepared here; `reason` says why (the job fails with it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def run_share(python: str, claim: dict[str, Any], *, stop: threading.Event, on_line: Callable[[str], None],
              workers: int = 0) -> dict[str, Any]:
    """Prepare the share `claim` names (`runtime.data.prepare_share`) and return its JSON line;
    `on_line` gets each progress line. Raises `PrepareFailed` with the module's message (bad data)
    or the end of its output (a crash); returns {} when `stop` was set (the process is killed)."""
    command = [python, "-m", "runtime.data.prepare_share", "--source", claim["source"], "--tokenizer",
               claim["tokenizer"], "--out", claim["out"], "--share", f"{claim['share']}/{claim['of']}",
               "--workers", str(workers or os.cpu_count() or 1)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: deque[str] = deque(maxlen=20)  # the end of its progress, for a crash's message
    reader = threading.Thread(target=_follow, args=(process.stderr, lines, on_line), daemon=True)
    reader.start()
    while process.poll() is None:
        if stop.wait(0.2):
            process.kill()
            process.wait()
            return {}
    reader.join(timeout=5.0)
    result = last_json_object(process.stdout.read())
    if process.returncode == 0 and result is not None and "index_written" in result:
        return result
    if result is not None and result.get("error"):
        raise PrepareFailed(str(result["error"])[:300])
    tail = lines[-1] if lines else "no output"
    raise PrepareFailed(f"preparing share {claim['share']}/{claim['of']} exited with status "
                        f"{process.returncode}: {tail}"[:300])


def _follow(stream: Any, lines: deque[str], on_line: Callable[[str], None]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        lines.append(line)
        on_line(line)
