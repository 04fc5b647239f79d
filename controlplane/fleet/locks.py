"""The one lock order for a transaction that writes a job's rows and its instances' rows: jobs
first, in id order, then instances, in id order.

Why one order: a row of a job's timeline, a reconfiguration or a billing segment share-locks its
job when it commits (PostgreSQL checks Django's deferred foreign keys then), and the instance rows
it names likewise. A transaction that locked an instance and then (at commit) needs its job,
against one that locked the job and then needs the instance, is a deadlock: PostgreSQL aborts one
of them (40P01). Taking both kinds of lock up front, in this order, makes the second one queue
behind the first instead.

How long taking the locks took (the wait behind other transactions and the locking reads) is
logged: at DEBUG always, with `lock_wait_ms` on the record (`python -m bench joblocks` collects
them), and as a warning above `SPOTPIPE_LOCK_WAIT_WARN_MS`, naming the jobs, so an operator sees
which job's work queues behind which."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db.models import QuerySet

from controlplane.fleet.models import Instance, job_model
from controlplane.tunables import tunable

if TYPE_CHECKING:
    from controlplane.jobs.models import TrainingJob

logger = logging.getLogger(__name__)


def _lock_jobs(job_ids: Iterable[int]) -> dict[int, TrainingJob]:
    wanted = sorted(set(job_ids))
    if not wanted:
        return {}
    return {job.pk: job for job in job_model().objects.select_for_update().filter(pk__in=wanted).order_by("pk")}


def lock_jobs_then_instances(
    *, job_ids: Iterable[int] = (), instances: QuerySet[Instance] | None = None
) -> tuple[dict[int, TrainingJob], list[Instance]]:
    """Lock (FOR UPDATE) the jobs `job_ids` and the jobs of `instances`, in id order, then the
    instances, in id order; returns ({job id: locked job}, locked instances), each instance's
    `job` set to its locked job (no second query). Call it in a transaction, before any other
    write that touches these rows."""
    started = time.perf_counter()
    wanted = set(job_ids)
    if instances is not None:
        wanted |= set(instances.exclude(job_id=None).values_list("job_id", flat=True))
    jobs = _lock_jobs(wanted)
    if instances is None:
        _log_wait(time.perf_counter() - started, jobs, 0)
        return jobs, []
    locked = list(instances.select_for_update(of=("self",)).order_by("id"))
    # An instance that matched only after the read above (a node attached meanwhile): its job is
    # locked last, out of order; rare, and the notice batch's retry covers a deadlock it causes.
    jobs.update(_lock_jobs({i.job_id for i in locked if i.job_id is not None} - jobs.keys()))
    for instance in locked:
        if instance.job_id in jobs:
            instance.job = jobs[instance.job_id]
    _log_wait(time.perf_counter() - started, jobs, len(locked))
    return jobs, locked


def _log_wait(seconds: float, jobs: dict[int, TrainingJob], instances: int) -> None:
    waited_ms = seconds * 1000.0
    level = logging.WARNING if waited_ms > tunable("SPOTPIPE_LOCK_WAIT_WARN_MS") else logging.DEBUG
    if logger.isEnabledFor(level):
        ids = sorted(jobs)
        logger.log(level, "locking jobs %s and %d instances took %.1f ms", ids[:10], instances, waited_ms,
                   extra={"lock_wait_ms": waited_ms, "locked_job_ids": ids, "locked_instances": instances})


def lock_instance(instance: Instance) -> Instance:
    """Lock one instance (and its job first, the order above); returns the locked row."""
    _jobs, locked = lock_jobs_then_instances(instances=Instance.objects.filter(pk=instance.pk))
    if not locked:
        raise Instance.DoesNotExist(f"instance {instance.pk} is gone")
    return locked[0]


def lock_job(job: TrainingJob) -> TrainingJob:
    """Lock one job (before any of its instances, the order above); returns the locked row."""
    jobs, _instances = lock_jobs_then_instances(job_ids=[job.pk])
    if job.pk not in jobs:
        raise job_model().DoesNotExist(f"job {job.pk} is gone")
    return jobs[job.pk]
