"""Concurrent writers of one job serialise on the job row: generation numbers stay consecutive
and metric progress is never lost (real threads, each with its own database connection).

On PostgreSQL the threads really race and `select_for_update` orders them. SQLite takes a
database-wide write lock per transaction (settings use IMMEDIATE transactions), but its in-memory
test database cannot host concurrent writers (shared-cache table locks fail at once instead of
waiting), so there the same workers run one after another and only the outcome is checked."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from controlplane.jobs.models import JobGeneration, MetricSample, TrainingJob
from controlplane.jobs.services import job_generation_publish, job_record_metrics
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 4


def _run_in_threads(target) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def worker(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            target(index)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)
        finally:
            connection.close()

    if connection.vendor == "sqlite":
        for index in range(THREADS):
            try:
                target(index)
            except BaseException as exc:
                errors.append(exc)
        return errors
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return errors


def test_concurrent_generation_publishes_get_consecutive_numbers():
    job = make_job(make_team())

    def publish(index: int) -> None:
        job_generation_publish(job=TrainingJob.objects.get(pk=job.pk),
                               membership=[{"instance": index + 1, "rank": 0}], layout={"dp": 1}, reason=str(index))

    assert _run_in_threads(publish) == []
    numbers = sorted(JobGeneration.objects.filter(job=job).values_list("number", flat=True))
    assert numbers == list(range(1, THREADS + 1))
    job.refresh_from_db()
    assert job.current_generation == THREADS


def test_concurrent_metric_batches_keep_the_highest_progress():
    job = make_job(make_team())

    def report(index: int) -> None:
        samples = [{"step": index * 10 + s, "loss": 10.0 - index - s / 10} for s in range(1, 11)]
        job_record_metrics(job=TrainingJob.objects.get(pk=job.pk), samples=samples)

    assert _run_in_threads(report) == []
    job.refresh_from_db()
    assert MetricSample.objects.filter(job=job).count() == THREADS * 10
    assert job.steps_done == THREADS * 10
    assert job.last_loss == pytest.approx(10.0 - (THREADS - 1) - 1.0)
