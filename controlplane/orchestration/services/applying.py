"""When a decided reconfiguration is applied: whoever decides one (the notice processor in
`orchestration.notices`, `liveness` for a node that stopped) calls `reconfigurations_apply_after_commit`
inside its transaction, and the next generation is published once the decision has committed.

In a Celery worker (the notice drain) it is applied inline: one broker hop less between a notice
and the agents' new generation. From anywhere else it is handed to the `apply_reconfiguration`
task. Applying is idempotent (a reconfiguration moves from decided to applied under the job lock),
so the reconciler's later pass over decided rows never applies one twice."""

from __future__ import annotations

import logging

from django.db import transaction

from controlplane.jobs.models import Reconfiguration, ReconfigurationStatus, ReconfigurationTrigger
from controlplane.orchestration.enqueue import enqueue
from controlplane.orchestration.services import generations

logger = logging.getLogger(__name__)


def _in_worker() -> bool:
    """Whether this runs inside a Celery task (the notice processor's drain)."""
    from celery import current_task

    return bool(current_task and current_task.request.id)


def _apply_one(reconfiguration_id: int) -> None:
    # Imported here, not at the top: the tasks module imports these services (its tasks wrap them).
    from controlplane.orchestration import tasks

    if _in_worker():
        try:
            reconfiguration = Reconfiguration.objects.select_related("job").get(pk=reconfiguration_id)
            generations.reconfiguration_apply(reconfiguration=reconfiguration)
            return
        except Exception:
            logger.exception("applying reconfiguration %s inline failed; handing it to a task", reconfiguration_id)
    enqueue(tasks.apply_reconfiguration, reconfiguration_id)


def _apply_now(reconfigurations: list[Reconfiguration]) -> None:
    """A batch decided together is applied together in a worker: one transaction and a constant
    number of statements, with the same end state as applying each in turn. If that fails, each
    is applied on its own, so one failing reconfiguration cannot hold back the others."""
    if _in_worker():
        try:
            generations.reconfigurations_apply(reconfigurations=reconfigurations)
            return
        except Exception:
            logger.exception(
                "applying %d reconfigurations together failed; applying them one by one", len(reconfigurations)
            )
    for reconfiguration in reconfigurations:
        _apply_one(reconfiguration.pk)


def reconfigurations_apply_after_commit(*, reconfigurations: list[Reconfiguration]) -> None:
    """Apply the decided leave reconfigurations among `reconfigurations` once the caller's
    transaction commits (at once outside one). Joins are applied by their decider
    (`generations.job_grow`), and rows already applied or skipped are left alone."""
    rows = [
        r
        for r in reconfigurations
        if r.trigger != ReconfigurationTrigger.JOIN and r.status == ReconfigurationStatus.DECIDED
    ]
    if rows:
        transaction.on_commit(lambda: _apply_now(rows))
