"""The Celery application of the control plane (configured from Django settings, CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery

from controlplane import broker

broker.register()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
