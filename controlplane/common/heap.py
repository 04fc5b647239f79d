"""The long-lived part of a server process's heap, moved out of the garbage collector's way.

A control-plane process holds a few hundred thousand objects it never frees: Django, DRF, Celery,
every module, view and serializer, and torch once the planner has predicted a plan (torch alone is
about 270,000 tracked objects; it is imported on the first prediction, not at start-up). Each full
(generation 2) collection of CPython's cyclic collector walks all of them: 130-250 ms every few
reactions on a 1,024-node job, inside whatever request or task triggered it (measured on
`python -m bench joblocks`' worker code: notice -> generation 77-110 ms typically, 210-250 ms when
a full collection fell inside). `gc.freeze()` moves what exists into a permanent generation that
collections skip (full collections of 1-2 ms afterwards, same measurement). So a server process
freezes once started (`freeze_startup_heap`) and again, once, after a task or request that
imported modules (`freeze_new_modules`: torch's first import). What is created later is collected
as before; an object frozen while alive that later becomes cyclic garbage is not freed, which
modules, classes and settings do not do."""

from __future__ import annotations

import gc
import logging
import sys

logger = logging.getLogger(__name__)

_modules_when_frozen = 0  # len(sys.modules) at the last freeze; 0: this process never froze


def _freeze(why: str) -> int:
    global _modules_when_frozen
    gc.collect()
    gc.freeze()
    _modules_when_frozen = len(sys.modules)
    frozen = gc.get_freeze_count()
    logger.debug("froze %d objects out of the cyclic collector's full passes (%s)", frozen, why)
    return frozen


def freeze_startup_heap() -> int:
    """Import what a request or task would import on first use (the URLconf's views), collect
    once, then freeze every tracked object. Call it when a server process has finished starting
    (the web application module, a Celery worker process). Returns how many objects are frozen."""
    from django.core.signals import request_finished
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - loads every view module now, not on the first request
    request_finished.connect(freeze_new_modules, weak=False, dispatch_uid="spotpipe-freeze-new-modules")
    return _freeze("start-up")


def freeze_new_modules(**_kwargs: object) -> None:
    """At the end of a task or request (connected to both): if modules were imported since this
    process last froze (torch, by the planner's first prediction), freeze again, so their objects
    leave the full passes too. A length check otherwise; nothing before the start-up freeze."""
    if _modules_when_frozen and len(sys.modules) != _modules_when_frozen:
        _freeze("modules imported since the last freeze")
