"""Run the first node's profile of a job's model function (`runtime.train.node_profile`) in the
job's own environment, as its worker would run: the same python, working directory and environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from agent.json_lines import last_json_object

PROFILE_TIMEOUT_S = 600.0
"""A model builds, runs one micro-batch per layer and is measured well within this on any node."""


class ProfileFailed(Exception):
    """The model could not be profiled here; `reason` says why (the job fails with it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def run_node_profile(python: str, config: dict[str, Any], *, work_dir: Path,
                     timeout_s: float = PROFILE_TIMEOUT_S) -> dict[str, Any]:
    """The profile `python -m runtime.train.node_profile` prints for `config` (a job's JobConfig
    dict). Raises `ProfileFailed` with its message (a model that cannot run, data it cannot read),
    or with the end of its output when it crashed or ran past `timeout_s`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "profile-config.json"
    path.write_text(json.dumps(config))
    try:
        done = subprocess.run([python, "-m", "runtime.train.node_profile", "--config", f"@{path}"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
                              cwd=os.getcwd(), env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
    except subprocess.TimeoutExpired:
        raise ProfileFailed(f"profiling the model took longer than {timeout_s:.0f} s") from None
    result = last_json_object(done.stdout)
    if done.returncode == 0 and result is not None and "layers" in result:
        return result
    if result is not None and result.get("error"):
        field = f" ({result['field']})" if result.get("field") else ""
        raise ProfileFailed(f"{result['error']}{field}"[:300])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise ProfileFailed(f"the profile exited with status {done.returncode}: {tail}"[:300])
