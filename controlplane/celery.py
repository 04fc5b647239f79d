"""The Celery application of the control plane (configured from Django settings, CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery, signals

from controlplane import broker

broker.register()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Per-task database connection upkeep, as Django does per request (see common/connections.py).
def _connect_connection_upkeep() -> None:
    from controlplane.common.connections import task_connections_checked

    signals.task_prerun.connect(task_connections_checked, weak=False)
    signals.task_postrun.connect(task_connections_checked, weak=False)


_connect_connection_upkeep()


# Start-up objects out of the collector's full passes, once a worker process is ready
# (controlplane/common/heap.py): a prefork child after its fork, a threads/solo worker when ready;
# and modules a task imported (torch, on a plan's first prediction), once, after that task.
def _freeze_startup_heap(**_kwargs: object) -> None:
    from controlplane.common.heap import freeze_startup_heap

    freeze_startup_heap()


def _freeze_new_modules(**_kwargs: object) -> None:
    from controlplane.common.heap import freeze_new_modules

    freeze_new_modules()


signals.worker_process_init.connect(_freeze_startup_heap, weak=False)
signals.worker_ready.connect(_freeze_startup_heap, weak=False)
signals.beat_init.connect(_freeze_startup_heap, weak=False)
signals.task_postrun.connect(_freeze_new_modules, weak=False)
