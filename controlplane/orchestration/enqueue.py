"""Publishing orchestration tasks: a broker that is down is logged, not raised, because the periodic
reconcile repairs whatever the task would have done."""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Task
from django.db import transaction

logger = logging.getLogger(__name__)


def enqueue(task: Task, *args: Any) -> None:
    """Publish `task` with `args` now; a broker that is down is logged."""
    try:
        task.delay(*args)
    except Exception:
        logger.exception("could not enqueue %s%s; the periodic reconcile will catch up", task.name, args)


def enqueue_on_commit(task: Task, *args: Any) -> None:
    """`enqueue` once the current transaction commits (at once outside one): Celery's
    `delay_on_commit`, with a broker that is down logged as `enqueue` does."""
    transaction.on_commit(functools.partial(enqueue, task, *args))
