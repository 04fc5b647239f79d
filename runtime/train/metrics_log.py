"""Append-only JSON-lines logs: the per-node metrics log (`metrics-<node>.jsonl`, one record per
line, appended by a worker) and the agent's `commands.jsonl` are read while they are written.

A writer can also be killed or stopped (SIGSTOP) in the middle of a write, so a line without its
newline is a record not yet (or never) written: skip it rather than fail on half a JSON object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record in `path`; a missing file has none."""
    try:
        text = path.read_text()
    except OSError:
        return []
    complete = text[: text.rfind("\n") + 1]  # drop a torn last line
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
