"""Hooks from other apps' writes into orchestration, without those apps knowing about it.

A Reconfiguration row is decided by whoever learns that a node leaves (the notice processor in
`fleet.notices`, our heartbeat watchdog); applying it (publishing the next generation) is ours.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_save

from controlplane.jobs.models import Reconfiguration, ReconfigurationStatus, ReconfigurationTrigger

logger = logging.getLogger(__name__)


def _apply(reconfiguration_id: int) -> None:
    """Apply at once when we already are in a worker (the notice processor's task): one broker
    hop less between a notice and the agents' new generation. From anywhere else, enqueue."""
    from celery import current_task

    from controlplane.orchestration import services

    if current_task and current_task.request.id:
        try:
            reconfiguration = Reconfiguration.objects.select_related("job").get(pk=reconfiguration_id)
            services.reconfiguration_apply(reconfiguration=reconfiguration)
            return
        except Exception:
            logger.exception("applying reconfiguration %s inline failed; handing it to a task", reconfiguration_id)
    services.task_enqueue("apply_reconfiguration", reconfiguration_id)


def _on_reconfiguration_saved(sender, instance: Reconfiguration, created: bool, **kwargs) -> None:
    if not created or instance.trigger == ReconfigurationTrigger.JOIN:
        return
    if instance.status != ReconfigurationStatus.DECIDED:
        return
    transaction.on_commit(lambda: _apply(instance.pk))


def connect() -> None:
    post_save.connect(_on_reconfiguration_saved, sender=Reconfiguration, dispatch_uid="orchestration.reconfiguration")
