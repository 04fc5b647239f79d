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


@signals.task_prerun.connect
def _drop_broken_db_connections(**_: object) -> None:
    # A worker process must not be left failing every task after a database restart.
    from controlplane.common.connections import drop_broken_connections

    drop_broken_connections()
