"""Structured (JSON) logs, with the job and instance a line is about.

`log_context(job_id=..., instance_id=...)` binds ids for the code running inside it (a contextvar,
so it is per request/task and thread-safe); `ContextFilter` copies them, and any `extra={"job_id":..}`
given to a log call, onto the record; `JsonFormatter` writes one JSON object per line.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

CONTEXT_FIELDS = ("job_id", "instance_id", "notice_id", "team_id", "request_id", "task")
# An immutable default (a tuple of pairs): a shared mutable dict default would leak between contexts.
_Pairs = tuple[tuple[str, Any], ...]
_context: contextvars.ContextVar[_Pairs] = contextvars.ContextVar("spotpipe_log_context", default=())

# Last line of defence: a bearer key or a password-like field that reached a message is masked.
_SECRET_PATTERNS = [
    (re.compile(r"\bsp_[A-Za-z0-9_\-]{8,}"), "sp_***"),
    (re.compile(r"(?i)((?:token|bearer)\s+)[A-Za-z0-9_\-\.]{8,}"), r"\1***"),
    (re.compile(r"(?i)(\"?(?:password|secret|enroll_key)\"?\s*[:=]\s*\"?)[^\s\",}]+"), r"\1***"),
]


def redact(text: str) -> str:
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Bind ids (job_id, instance_id, ...) to every log record emitted inside the block."""
    merged = {**dict(_context.get()), **{k: v for k, v in ids.items() if v is not None}}
    token = _context.set(tuple(merged.items()))
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    return dict(_context.get())


class ContextFilter(logging.Filter):
    """Adds the bound ids to each record (explicit `extra=` values win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC ISO 8601), level, logger, message, ids, exception."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                payload[key] = value
        if record.exc_info:
            payload["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


# Route kwarg -> context field, for `LogContextMiddleware` (by the URL's resource: /jobs/<pk>/...).
_ROUTE_IDS = {"jobs": "job_id", "instances": "instance_id", "notices": "notice_id"}


class LogContextMiddleware:
    """Binds the job/instance a request is about (from the URL, or the agent's own instance) for the
    log lines emitted while it is handled."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _context.set(_context.get())  # a fresh binding scope per request
        try:
            return self.get_response(request)
        finally:
            _context.reset(token)

    def process_view(self, request, view_func, view_args, view_kwargs):
        ids: dict[str, Any] = {}
        for key in ("job_id", "instance_id"):
            if key in view_kwargs:
                ids[key] = view_kwargs[key]
        if "pk" in view_kwargs:
            parts = [p for p in request.path.split("/") if p]
            for resource, field_name in _ROUTE_IDS.items():
                if resource in parts:
                    ids[field_name] = view_kwargs["pk"]
        if ids:
            merged = {**dict(_context.get()), **ids}
            _context.set(tuple(merged.items()))
        return None


def _bind_task_ids(sender=None, task_id=None, task=None, args=None, kwargs=None, **_):
    """Celery `task_prerun`: a task's job_id/instance_id/notice_id keyword arguments become log context."""
    ids = {k: v for k, v in (kwargs or {}).items() if k in CONTEXT_FIELDS}
    ids["task"] = getattr(task, "name", None)
    _context.set(tuple({k: v for k, v in ids.items() if v is not None}.items()))


def _clear_task_ids(**_):
    _context.set(())


def connect_celery_signals() -> None:
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(_bind_task_ids, weak=False, dispatch_uid="spotpipe-log-context-prerun")
    task_postrun.connect(_clear_task_ids, weak=False, dispatch_uid="spotpipe-log-context-postrun")


# The LOGGING setting for JSON lines (docs/reliability.md): settings.LOGGING = LOGGING_JSON, or
# select it with an environment switch.
LOGGING_JSON: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "controlplane.observability.logs.ContextFilter"}},
    "formatters": {"json": {"()": "controlplane.observability.logs.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["context"]}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
