"""The orchestration tasks through a real Celery worker (the configured broker: the filesystem
transport by default, Redis when REDIS_URL is set), on a queue of this test's own."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery.signals import task_postrun
from django.db import OperationalError, connection
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import Reconfiguration
from controlplane.orchestration import services, tasks
from controlplane.orchestration.models import Acquisition
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.services.transitions import _transition
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.conftest import quiesce_worker
from tests.orchestration.fakes import FakeProvider


def retrying(fn, *args, **kwargs):
    """Call fn, retrying while the test database is locked by the worker thread (SQLite's shared
    in-memory test database locks whole tables and has no busy timeout)."""
    for _ in range(100):
        try:
            return fn(*args, **kwargs)
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.05)
    return fn(*args, **kwargs)


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = retrying(predicate)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def worker(orchestration_worker):
    """The session's real worker, with the in-memory provider as the local provider."""
    provider = FakeProvider()
    set_provider("local", provider)
    try:
        yield provider
    finally:
        quiesce_worker(orchestration_worker)
        set_provider("local", None)
        connection.close()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_acquire_twice_acquires_once_and_death_publishes_a_generation(worker, monkeypatch):
    # Only the node the test makes silent may be found dead: with the 2 s default, the live nodes'
    # heartbeats (stamped by the test, no agents here) went stale too whenever the detection task
    # reached the worker more than 2 s later, as it can on a loaded 2-core machine.
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "60")
    job = make_job(make_team(), strategy="recycle", target_steps=10, plan={"dp": 2, "pp": 2, "provider": "local"})

    finished: list[str] = []

    def count_acquisitions(sender=None, state=None, **kwargs) -> None:
        if sender is not None and sender.name == tasks.acquire_capacity.name and state == "SUCCESS":
            finished.append(state)

    task_postrun.connect(count_acquisitions, weak=False)
    try:
        tasks.acquire_capacity.delay(job.pk)
        tasks.acquire_capacity.delay(job.pk)  # a duplicate delivery
        # Both deliveries ran to the end (a fixed pause did not make sure of the duplicate), so what
        # follows is what the duplicate left, not what it had yet to do.
        wait_for(lambda: len(finished) >= 2, what="both deliveries to run")
    finally:
        task_postrun.disconnect(count_acquisitions)
    assert retrying(Instance.objects.filter(job=job, state=InstanceState.PENDING).count) == 4
    assert not retrying(Acquisition.objects.filter(job=job, status="launching").exists)
    assert retrying(Acquisition.objects.filter(job=job).count) == 1
    assert len(worker.by_token) == 1 and sum(len(v) for v in worker.by_token.values()) == 4

    acquisition = retrying(Acquisition.objects.get, job=job)
    key = services.acquisition_enroll_key(acquisition=acquisition)
    instances = retrying(lambda: list(Instance.objects.filter(job=job).order_by("id")))
    for instance in instances:  # enrolment enqueues instance_joined on commit
        retrying(services.agent_enroll, enroll_key=key, provider_instance_id=instance.provider_instance_id)
    wait_for(lambda: job.generations.filter(number=1).exists(), what="generation 1 from the worker")

    retrying(Instance.objects.filter(job=job).update, last_heartbeat_at=timezone.now())
    retrying(Instance.objects.filter(pk=instances[3].pk).update,
             last_heartbeat_at=timezone.now() - timedelta(seconds=120))
    tasks.detect_dead_agents.delay()
    wait_for(lambda: job.generations.filter(number=2).exists(), what="generation 2 after the death")
    generation = retrying(job.generations.get, number=2)
    assert instances[3].pk not in {m["instance"] for m in generation.membership}
    assert retrying(Reconfiguration.objects.get, job=job).decision == "reroute"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_notice_decided_elsewhere_is_applied_by_the_worker(worker):
    """A reconfiguration decided outside a worker (the notice processor's decision, here by hand) and
    handed to orchestration is applied by the `apply_reconfiguration` task in the worker."""
    from controlplane.jobs.reconfiguration import reconfiguration_decide

    job = make_job(make_team(), strategy="oobleck", target_steps=10, plan={"dp": 2, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    key = services.acquisition_enroll_key(acquisition=acquisition)
    instances = list(Instance.objects.filter(job=job).order_by("id"))
    for instance in instances:
        retrying(services.agent_enroll, enroll_key=key, provider_instance_id=instance.provider_instance_id)
    wait_for(lambda: job.generations.filter(number=1).exists(), what="generation 1")

    retrying(_transition, instances[0], InstanceState.NOTICE)
    decided = retrying(reconfiguration_decide, job=job, trigger="notice",
                       trigger_key=f"leave:instance:{instances[0].pk}", instance=instances[0])
    services.reconfigurations_apply_after_commit(reconfigurations=[decided])  # no transaction: at once
    wait_for(lambda: job.generations.filter(number=2).exists(), what="generation 2 after the notice")
    assert retrying(Reconfiguration.objects.get, job=job, trigger="notice").decision == "reinstantiate"
