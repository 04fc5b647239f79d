"""The result line of a module the agent runs as a subprocess (`runtime.train.node_profile`,
`runtime.data.prepare_share`): the last line of its stdout that is a JSON object."""

from __future__ import annotations

import json
from typing import Any


def last_json_object(stdout: str) -> dict[str, Any] | None:
    """The last line of `stdout` that parses as a JSON object (None: there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None
