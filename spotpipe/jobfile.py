"""The job file: one TOML file holding a job's whole contract, as `POST /api/v1/jobs/` takes it.

    name = "gpt-small"
    strategy = "recycle"          # auto, checkpoint, bamboo, recycle, oobleck
    target_steps = 500
    deadline = "6h"               # an ISO time, a TOML datetime, or a duration from now (90s, 30m, 6h, 2d)
    budget_usd = 25.0             # a deadline, a budget, or both
    capacity = "spot"             # spot, spot_then_on_demand, on_demand
    priority = 100                # optional: the team's queue order (0-1000, higher first)
    max_runtime_s = 86400         # optional limits: stop (checkpoint first) after this long training,
    max_wait_s = 3600             #   or after this long without capacity; crashes survived:
    max_restarts_on_errors = 3    #   the next one fails the job (end_reason user_error)
    export = "hf"                 # also a Hugging Face GPT-2 folder hf/ beside the weights (config.export)
    tracking = ["mlflow"]         # mlflow, wandb (train: also tensorboard); submit: the control plane logs

    [config]                      # the runtime's JobConfig fields (runtime/config.py) but the layout
    global_batch = 32
    seed = 0
    [config.model]
    kind = "gpt"
    n_layer = 4

    [plan]                        # omitted: one node; auto = true: the planner chooses
    dp = 2
    pp = 2

`spotpipe submit FILE` sends it to a control plane (which validates it with the same code as any
request: its 400s are printed as they are); `spotpipe train FILE` runs it here without one. Both read
it here, which checks only the file: TOML syntax, the top-level keys, `target_steps` (a positive
integer) and the deadline's forms (`DEADLINE_FORMS`).
"""

from __future__ import annotations

import re
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TOP_LEVEL = ("name", "strategy", "target_steps", "deadline", "budget_usd", "capacity", "config", "model_spec",
             "plan", "priority", "max_runtime_s", "max_wait_s", "max_restarts_on_errors", "allow_over_budget",
             "export", "tracking")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DEADLINE_FORMS = ('a duration from now ("90s", "30m", "6h", "2d"), an ISO time with an offset '
                  '("2026-12-01T18:00:00Z") or a TOML datetime with an offset')


class JobFileError(ValueError):
    """A job file that cannot be read; the message names the file and what is wrong."""


def _deadline(value: Any, *, now: datetime) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise JobFileError(f"deadline {value} has no time zone; write it with an offset, e.g. Z")
        return value.isoformat()
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return (now + timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])).isoformat()
        try:
            written = datetime.fromisoformat(value.strip())
        except ValueError:
            raise JobFileError(f"deadline {value!r} is not a time or a duration; expected {DEADLINE_FORMS}") from None
        if written.tzinfo is None:
            raise JobFileError(f"deadline {value!r} has no time zone; write it with an offset, e.g. Z")
        return value  # sent as written: the control plane checks it is in the future
    raise JobFileError(f"deadline {value!r} is not a time or a duration; expected {DEADLINE_FORMS}")


def _check_steps(body: dict[str, Any]) -> None:
    """`target_steps`, read the same by `submit` and `train`: a TOML integer, never a string."""
    if "target_steps" not in body:
        return
    steps = body["target_steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise JobFileError(f"target_steps must be a positive integer (written without quotes), got {steps!r}")


def load_job_file(path: str | Path, *, now: datetime | None = None, at_send: bool = False) -> dict[str, Any]:
    """The request body of the job in `path`. Raises `JobFileError` for a file that cannot be read
    as a job (missing, not TOML, unknown top-level keys, a `target_steps` or deadline of another
    form). A deadline given as a duration counts from `now`; with `at_send`, it is left as written
    for `deadline_at_send` (a client's checks may take a while, and the duration counts from the
    request)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise JobFileError(f"{path}: no such file") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise JobFileError(f"{path}: not a TOML file: {exc}") from exc
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise JobFileError(f"{path}: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(TOP_LEVEL)}")
    body = dict(data)
    body.setdefault("name", path.stem)
    config = body.setdefault("config", {}) if "export" in body else None
    if isinstance(config, dict):  # `export` is a contract field (the nodes write it), at the top for short
        if config.get("export", body["export"]) != body["export"]:
            raise JobFileError(f"{path}: export = {body['export']!r} and config.export = {config['export']!r}; "
                               "expected one of them")
        config["export"] = body.pop("export")
    try:
        _check_steps(body)
        checked = deadline_at_send(body, now=now or datetime.now(UTC))  # a bad deadline fails here, at once
    except JobFileError as exc:
        raise JobFileError(f"{path}: {exc}") from exc
    return body if at_send else checked


def deadline_at_send(body: dict[str, Any], *, now: datetime | None = None) -> dict[str, Any]:
    """`body` with a duration deadline ("6h") turned into the time it ends, counted from `now`
    (default: this moment, just before the request goes)."""
    if "deadline" not in body:
        return body
    return {**body, "deadline": _deadline(body["deadline"], now=now or datetime.now(UTC))}
