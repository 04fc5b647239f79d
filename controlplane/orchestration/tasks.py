"""Celery tasks of the orchestration app: thin wrappers over `orchestration.services` (ids in, no
objects). Every task is safe to run twice; transient errors (database, provider throttling) are
retried with backoff, a bounded number of times."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError

from controlplane.fleet.models import Instance
from controlplane.fleet.notices.handoff import DRAIN_TASK, PROCESS_TASK, SWEEP_TASK, drain_pace, drain_started
from controlplane.jobs.admission import queue_admit
from controlplane.jobs.models import Reconfiguration, TrainingJob
from controlplane.orchestration import heartbeat_watch, notices, services
from controlplane.orchestration.models import Acquisition
from controlplane.orchestration.providers import ProviderError
from controlplane.orchestration.services.job_stop import give_back_quota

logger = logging.getLogger(__name__)


class TransientProviderError(Exception):
    """A provider error worth retrying (throttling, connection, eventual consistency)."""


def _run_provider_call(fn, **kwargs):
    try:
        return fn(**kwargs)
    except ProviderError as exc:
        if exc.transient:
            raise TransientProviderError(str(exc)) from exc
        raise


TASK_OPTIONS = {
    "acks_late": True,
    "ignore_result": True,
    "autoretry_for": (OperationalError, TransientProviderError),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 5,
}


@shared_task(name="orchestration.acquire_capacity", **TASK_OPTIONS)
def acquire_capacity(job_id: int) -> dict:
    """Request the job's missing capacity and launch it (one acquisition however often it runs)."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:  # deleted since it was enqueued
        return {"requested": 0, "launched": 0}
    acquisition = services.capacity_request(job=job)
    launched = []
    for pending in Acquisition.objects.filter(job=job, status__in=("requested", "launching")):
        launched += _run_provider_call(services.acquisition_launch, acquisition=pending)
    return {"requested": acquisition.count if acquisition else 0, "launched": len(launched)}


@shared_task(name="orchestration.launch_acquisition", **TASK_OPTIONS)
def launch_acquisition(acquisition_id: int) -> int:
    acquisition = Acquisition.objects.filter(pk=acquisition_id).first()
    if acquisition is None:
        return 0
    return len(_run_provider_call(services.acquisition_launch, acquisition=acquisition))


@shared_task(name="orchestration.reconcile_job", **TASK_OPTIONS)
def reconcile_job(job_id: int) -> dict:
    """Repair one job's capacity (see `services.capacity_reconcile`)."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return {"job": job_id, "gone": True}
    return _run_provider_call(services.capacity_reconcile, job=job)


@shared_task(name="orchestration.reconcile_all", acks_late=True, ignore_result=True)
def reconcile_all() -> int:
    """Periodic: admit queued jobs the quotas have room for, then fan out one reconcile per job that
    holds or wants capacity."""
    queue_admit(give_back=give_back_quota)
    ids = services.active_job_ids()
    for job_id in ids:
        reconcile_job.delay(job_id)
    return len(ids)


@shared_task(name="orchestration.release_job", **TASK_OPTIONS)
def release_job(job_id: int) -> list[int]:
    """Release every node of an ended (finished, failed, cancelled) job."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return []
    return _run_provider_call(services.capacity_release, job=job)


@shared_task(name="orchestration.detect_dead_agents", acks_late=True, ignore_result=True,
             autoretry_for=(OperationalError,), max_retries=2)
def detect_dead_agents() -> list[int]:
    """Periodic: nodes whose heartbeats stopped are lost; their jobs react. Not while the control
    plane itself has just been deaf (see `heartbeat_watch`)."""
    heard_until = heartbeat_watch.heard_until(timeout_s=services.heartbeat_timeout_s())
    if heard_until is None:
        return []
    return services.instances_detect_dead(now=heard_until)


@shared_task(name="orchestration.apply_reconfiguration", **TASK_OPTIONS)
def apply_reconfiguration(reconfiguration_id: int) -> int | None:
    """Choose the strategy's reaction to a leaving node and publish the next generation."""
    reconfiguration = Reconfiguration.objects.select_related("job").filter(pk=reconfiguration_id).first()
    if reconfiguration is None:
        return None
    generation = services.reconfiguration_apply(reconfiguration=reconfiguration)
    return generation.number if generation is not None else None


@shared_task(name="orchestration.instance_joined", **TASK_OPTIONS)
def instance_joined(instance_id: int) -> int | None:
    """A node enrolled: start the job or grow it back."""
    instance = Instance.objects.select_related("job").filter(pk=instance_id).first()
    if instance is None or instance.job is None:
        return None
    generation = services.job_grow(job=instance.job, instance=instance)
    return generation.number if generation is not None else None


# Interruption notices: claimed from fleet's outbox and reacted to here (`orchestration.notices`).


@shared_task(
    name=DRAIN_TASK, acks_late=True, ignore_result=True,
    autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3,
)
def drain_notices() -> dict:
    """Claim stored notices in batches and react to each. Safe to run twice or concurrently."""
    drain_pace()
    drain_started()
    result = notices.notices_drain(paced=True)
    if result.more:
        # Hand the rest to a fresh task instead of holding this worker past its budget.
        drain_notices.delay()
    return {"processed": result.processed, "failed": result.failed, "batches": result.batches}


@shared_task(
    name=SWEEP_TASK, acks_late=True, ignore_result=True,
    autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3,
)
def sweep_notices() -> dict:
    """Periodic: requeue stale claims and drain whatever was stored but never processed."""
    result = notices.notices_sweep()
    if result.more:
        drain_notices.delay()
    if result.processed:
        logger.info("sweep processed %d notices left behind", result.processed)
    return {"processed": result.processed, "failed": result.failed, "batches": result.batches}


@shared_task(
    name=PROCESS_TASK, acks_late=True, ignore_result=True,
    autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3,
)
def process_notice(notice_id: int) -> None:
    """One notice per task: the `per_request` hand-off (the bench's baseline), not the default."""
    notices.notice_process(notice_id=notice_id)
