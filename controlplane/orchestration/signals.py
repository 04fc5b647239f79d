"""Hooks from other apps' writes into orchestration, without those apps knowing about it.

A Reconfiguration row is decided by whoever learns that a node leaves (the notice processor in
`fleet.notices`, our heartbeat watchdog); applying it (publishing the next generation) is ours.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models.signals import post_save

from controlplane.jobs.models import Reconfiguration, ReconfigurationStatus, ReconfigurationTrigger


def _on_reconfiguration_saved(sender, instance: Reconfiguration, created: bool, **kwargs) -> None:
    if not created or instance.trigger == ReconfigurationTrigger.JOIN:
        return
    if instance.status != ReconfigurationStatus.DECIDED:
        return
    from controlplane.orchestration.services import task_enqueue

    transaction.on_commit(lambda: task_enqueue("apply_reconfiguration", instance.pk))


def connect() -> None:
    post_save.connect(_on_reconfiguration_saved, sender=Reconfiguration, dispatch_uid="orchestration.reconfiguration")
