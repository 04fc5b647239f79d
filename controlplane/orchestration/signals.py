"""Hooks from other apps' writes into orchestration, without those apps knowing about it.

A Reconfiguration row is decided by whoever learns that a node leaves (the notice processor in
`fleet.notices`, our heartbeat watchdog); applying it (publishing the next generation) is ours.
One decided alone arrives by `post_save`; a batch decided together (the notice processor's) by
`jobs.reconfiguration.reconfigurations_decided`, and is applied together.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_save

from controlplane.jobs.models import Reconfiguration, ReconfigurationStatus, ReconfigurationTrigger
from controlplane.jobs.reconfiguration import reconfigurations_decided
from controlplane.orchestration import tasks
from controlplane.orchestration.enqueue import enqueue
from controlplane.orchestration.services import generations

logger = logging.getLogger(__name__)


def _in_worker() -> bool:
    """Whether this runs inside a Celery task (the notice processor's drain)."""
    from celery import current_task

    return bool(current_task and current_task.request.id)


def _apply(reconfiguration_id: int) -> None:
    """Apply at once when we already are in a worker (the notice processor's task): one broker
    hop less between a notice and the agents' new generation. From anywhere else, enqueue."""
    if _in_worker():
        try:
            reconfiguration = Reconfiguration.objects.select_related("job").get(pk=reconfiguration_id)
            generations.reconfiguration_apply(reconfiguration=reconfiguration)
            return
        except Exception:
            logger.exception("applying reconfiguration %s inline failed; handing it to a task", reconfiguration_id)
    enqueue(tasks.apply_reconfiguration, reconfiguration_id)


def _apply_many(reconfigurations: list[Reconfiguration]) -> None:
    """A batch decided together (the notice processor's) is applied together in a worker: one
    transaction and a constant number of statements for the batch, with the same end state as
    applying each in turn (`generations.reconfigurations_apply`). If that fails, each is applied on
    its own as before, so one failing reconfiguration cannot hold back the others."""
    if _in_worker():
        try:
            generations.reconfigurations_apply(reconfigurations=reconfigurations)
            return
        except Exception:
            logger.exception(
                "applying %d reconfigurations together failed; applying them one by one", len(reconfigurations)
            )
    for reconfiguration in reconfigurations:
        _apply(reconfiguration.pk)


def _on_reconfiguration_saved(sender, instance: Reconfiguration, created: bool, **kwargs) -> None:
    if not created or instance.trigger == ReconfigurationTrigger.JOIN:
        return
    if instance.status != ReconfigurationStatus.DECIDED:
        return
    transaction.on_commit(lambda: _apply(instance.pk))


def _on_reconfigurations_decided(sender, reconfigurations: list[Reconfiguration], **kwargs) -> None:
    """`jobs.reconfiguration.reconfigurations_create` inserted a batch (a bulk insert sends no
    post_save): apply it once the batch commits."""
    rows = [
        r
        for r in reconfigurations
        if r.trigger != ReconfigurationTrigger.JOIN and r.status == ReconfigurationStatus.DECIDED
    ]
    if rows:
        transaction.on_commit(lambda: _apply_many(rows))


def connect() -> None:
    post_save.connect(_on_reconfiguration_saved, sender=Reconfiguration, dispatch_uid="orchestration.reconfiguration")
    reconfigurations_decided.connect(_on_reconfigurations_decided, dispatch_uid="orchestration.reconfigurations")
