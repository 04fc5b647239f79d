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
