"""The job state machine (issue 21, "Job states"): one table (`JOB_TRANSITIONS`), one writer
(`job_set_status`). Every move the table refuses raises, writes nothing and records no event; every
move it allows is made and put on the timeline; late orchestration events cannot revive an ended job."""

from __future__ import annotations

import itertools

import pytest

from controlplane.jobs.models import ENDED_JOB_STATUSES, JOB_TRANSITIONS, JobEvent, JobStatus, TrainingJob
from controlplane.jobs.services import CANCELLABLE, RESUMABLE, IllegalJobTransition, job_set_status
from controlplane.orchestration.services import transitions
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db

PAIRS = [(a, b) for a, b in itertools.product(JobStatus.values, repeat=2) if a != b]
ILLEGAL = [(a, b) for a, b in PAIRS if b not in JOB_TRANSITIONS[a]]
LEGAL = [(a, b) for a, b in PAIRS if b in JOB_TRANSITIONS[a]]


def test_the_table_names_every_status_and_only_statuses():
    assert set(JOB_TRANSITIONS) == set(JobStatus.values)
    assert all(set(following) <= set(JobStatus.values) for following in JOB_TRANSITIONS.values())
    assert JOB_TRANSITIONS[JobStatus.FINISHED] == frozenset()  # finished is final
    assert len(ILLEGAL) >= 20  # the table really refuses something


@pytest.mark.parametrize(("start", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_every_illegal_move_is_refused_and_writes_nothing(start, target):
    job = make_job(make_team(), status=start)
    events = JobEvent.objects.filter(job=job).count()
    with pytest.raises(IllegalJobTransition, match=f"job is '{start}' and cannot become '{target}'"):
        job_set_status(job, target, "try")
    stored = TrainingJob.objects.get(pk=job.pk)
    assert stored.status == start and stored.status_message == job.status_message
    assert JobEvent.objects.filter(job=job).count() == events


@pytest.mark.parametrize(("start", "target"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_every_legal_move_is_made_and_recorded(start, target):
    job = make_job(make_team(), status=start)
    assert job_set_status(job, target, f"to {target}") is True
    stored = TrainingJob.objects.get(pk=job.pk)
    assert stored.status == target and stored.status_message == f"to {target}"
    assert (stored.finished_at is not None) == (target in ENDED_JOB_STATUSES)
    event = JobEvent.objects.filter(job=job).latest("id")
    assert event.kind == f"job_{target}" and event.data["from"] == start


def test_cancel_and_resume_follow_the_table():
    assert {JobStatus.QUEUED, JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING,
            JobStatus.STOPPING} == CANCELLABLE
    assert {JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STOPPED} == RESUMABLE
    assert all(JobStatus.PENDING in JOB_TRANSITIONS[s] for s in RESUMABLE)


@pytest.mark.parametrize("ended", sorted(ENDED_JOB_STATUSES))
def test_a_late_reaction_does_not_revive_an_ended_job(ended):
    """Orchestration's writer refuses what the table refuses: a node loss reported after the job
    ended leaves it ended, with no new event and no alert."""
    job = make_job(make_team(), status=ended)
    events = JobEvent.objects.filter(job=job).count()
    transitions._job_set_status(job, JobStatus.RECOVERING, "waiting for replacements: late")
    assert TrainingJob.objects.get(pk=job.pk).status == ended
    assert JobEvent.objects.filter(job=job).count() == events
