"""Taking a job's locks is timed and logged (`controlplane.fleet.locks`): at DEBUG every time, with
`lock_wait_ms` on the record (what `python -m bench joblocks` collects), and as a warning naming the
job when it took longer than `SPOTPIPE_LOCK_WAIT_WARN_MS`. The wait behind another transaction needs
PostgreSQL's row locks (SQLite has one writer and no FOR UPDATE); the DEBUG record runs on both."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection, transaction

from controlplane.fleet.locks import lock_job, lock_jobs_then_instances
from controlplane.fleet.models import Instance
from tests.controlplane.factories import make_job, make_team

LOGGER = "controlplane.fleet.locks"
HOLD_S = 0.4


def _records(caplog, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.mark.django_db
def test_every_lock_taking_leaves_a_debug_record_with_its_time(caplog):
    job = make_job(make_team())
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with transaction.atomic():
        lock_jobs_then_instances(job_ids=[job.pk], instances=Instance.objects.filter(job=job))
    (record,) = _records(caplog, logging.DEBUG)
    assert record.locked_job_ids == [job.pk]
    assert record.locked_instances == 0
    assert 0.0 <= record.lock_wait_ms < 1000.0
    assert not _records(caplog, logging.WARNING)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lock_that_waited_past_the_threshold_is_a_warning_naming_the_job(caplog, settings):
    if connection.vendor != "postgresql":
        pytest.skip("a wait behind another transaction needs PostgreSQL's row locks (DATABASE_URL=postgres://...)")
    settings.SPOTPIPE_LOCK_WAIT_WARN_MS = 100.0
    job = make_job(make_team())
    holding = threading.Event()

    def hold_the_job() -> None:
        try:
            with transaction.atomic():
                lock_job(job)
                holding.set()
                time.sleep(HOLD_S)
        finally:
            connection.close()

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    holder = threading.Thread(target=hold_the_job)
    holder.start()
    assert holding.wait(10.0)
    with transaction.atomic():
        lock_job(job)
    holder.join()
    warnings = [r for r in _records(caplog, logging.WARNING) if r.threadName == threading.current_thread().name]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert warnings[0].locked_job_ids == [job.pk]
    assert warnings[0].lock_wait_ms >= HOLD_S * 1000 * 0.5
    assert f"[{job.pk}]" in warnings[0].getMessage()
