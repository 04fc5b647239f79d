"""The standby safety net: no node paid for without work. A running node of an active job that its
job's current generation does not take is told to stand by by the agent channel; the reconcile
stamps when that began (`Instance.standby_since`, cleared when a generation takes it). The plan's
own spares (`plan.nodes` beyond dp x pp) stand by by design; a node standing by beyond them for
longer than `SPOTPIPE_STANDBY_LIMIT_S` (300 s) is released, with a `standby_released` event and the
team's `node.standby_released` alert: the job had no generation coming for it."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobStatus, TrainingJob
from controlplane.jobs.selectors import job_runtime_config
from controlplane.jobs.services import job_record_event
from controlplane.orchestration.providers import get_provider
from controlplane.orchestration.selectors import job_current_generation
from controlplane.orchestration.services.transitions import _now, _transition
from controlplane.planning.plans import JobPlan
from controlplane.tunables import tunable
from controlplane.webhooks.alerts import alert_standby_released

logger = logging.getLogger(__name__)

STANDBY_RELEASED_EVENT = "standby_released"


def standby_limit_s() -> float:
    return float(tunable("SPOTPIPE_STANDBY_LIMIT_S"))


def standby_review(*, job: TrainingJob, now: datetime | None = None) -> list[int]:
    """Stamp the job's nodes that stand by, clear the stamps of members, and release the nodes that
    stood by past the limit beyond the plan's spares (oldest first). Returns the released ids."""
    generation = job_current_generation(job=job)
    if job.status not in ACTIVE_JOB_STATUSES or job.status == JobStatus.STOPPING or generation is None:
        return []  # no generation: the agents idle (not told to stand by) until the first is published
    now = now or _now()
    members = {m.get("instance") for m in generation.membership}
    running = list(Instance.objects.filter(job=job, state=InstanceState.RUNNING)
                   .only("id", "standby_since", "provider", "provider_instance_id"))
    standing = [i for i in running if i.pk not in members]
    fresh = [i.pk for i in standing if i.standby_since is None]
    taken = [i.pk for i in running if i.pk in members and i.standby_since is not None]
    if fresh:
        Instance.objects.filter(pk__in=fresh, standby_since__isnull=True).update(standby_since=now)
    if taken:
        Instance.objects.filter(pk__in=taken).update(standby_since=None)
    plan, config = JobPlan.from_dict(job.plan), job_runtime_config(job)
    spares = max(0, plan.nodes - config.dp * config.pp)
    limit = standby_limit_s()
    stamped = sorted((i for i in standing if i.standby_since is not None), key=lambda i: (i.standby_since, i.pk))
    overdue = [i for i in stamped if (now - i.standby_since).total_seconds() > limit]
    release = overdue[:max(0, len(standing) - spares)]
    ids = [i.provider_instance_id for i in release if i.provider_instance_id]
    if ids:
        get_provider(plan.provider).terminate(ids)
    for instance in release:
        stood = (now - instance.standby_since).total_seconds()
        with transaction.atomic():
            if not _transition(instance, InstanceState.TERMINATED, detail={"reason": "standby"}):
                continue
            job_record_event(job=job, kind=STANDBY_RELEASED_EVENT, message=(
                f"node {instance.pk} stood by {stood:.0f} s (limit {limit:.0f} s) with no generation taking it: "
                "released"), data={"instance": instance.pk, "standby_s": round(stood, 1), "limit_s": limit})
            alert_standby_released(job=job, instance_id=instance.pk, standby_s=stood)
        logger.warning("job %s: node %s released after standing by %.0f s", job.pk, instance.pk, stood)
    return [i.pk for i in release]
