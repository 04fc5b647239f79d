"""A launch whose attach fails after the provider call (a locked table, a lost connection) gives
its claim back, so the task's retry launches (the provider adopts the nodes by token) instead of
finding the acquisition held for LAUNCH_STALE_AFTER."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from controlplane.fleet.models import Instance
from controlplane.orchestration import services
from controlplane.orchestration.models import AcquisitionStatus
from controlplane.orchestration.services import acquisition as acquisition_services
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db


def test_a_failed_attach_releases_the_claim_and_the_retry_attaches_the_same_nodes(fake, monkeypatch):
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    attach = services.acquisition_attach

    def locked(**kwargs):
        raise OperationalError("database table is locked: fleet_instance")

    monkeypatch.setattr(acquisition_services, "acquisition_attach", locked)
    with pytest.raises(OperationalError):
        services.acquisition_launch(acquisition=acquisition)
    acquisition.refresh_from_db()
    assert acquisition.status == AcquisitionStatus.REQUESTED and "locked" in acquisition.error

    monkeypatch.setattr(acquisition_services, "acquisition_attach", attach)
    attached = services.acquisition_launch(acquisition=acquisition)  # the task's retry
    assert len(attached) == 2
    assert len(fake.by_token) == 1  # one launch at the provider: the retry adopted its nodes
    assert sorted(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True)) == [
        "fake-1", "fake-2"]
    acquisition.refresh_from_db()
    assert acquisition.status == AcquisitionStatus.FULFILLED and acquisition.attempts == 2


def _ended_and_released(job) -> None:
    """What a job's end does to its capacity: the status, then the release of its instances."""
    from controlplane.jobs.models import JobStatus, TrainingJob

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    job.refresh_from_db()
    services.capacity_release(job=job)


def test_a_launch_queued_past_its_jobs_end_launches_nothing(fake):
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    _ended_and_released(job)
    assert services.acquisition_launch(acquisition=acquisition) == []  # the task ran late
    assert fake.launches == []
    acquisition.refresh_from_db()
    assert acquisition.status == AcquisitionStatus.FAILED and "ended" in acquisition.error


def test_nodes_launched_while_their_job_was_released_are_terminated(fake, django_capture_on_commit_callbacks):
    """The job ended while the provider call was in flight: its release found the instances still
    requested (no node to terminate yet) and ended them; the nodes that launch then come back are
    terminated when the attach commits, not left running with no instance to be released by."""
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    launch = fake.launch

    def released_meanwhile(request):
        _ended_and_released(job)
        return launch(request)

    fake.launch = released_meanwhile
    with django_capture_on_commit_callbacks(execute=True):
        assert services.acquisition_launch(acquisition=acquisition) == []
    assert sorted(fake.terminated) == ["fake-1", "fake-2"]
    assert set(Instance.objects.filter(job=job).values_list("state", flat=True)) == {"terminated"}
