"""A job moves region (issue 38) on the aws provider against moto serving two regions: its region has
given no capacity for its missing nodes past its patience while the other region has some, so the
nodes it still has are released (in their region), it restarts from its newest checkpoint, the move
is an event with its cost, and its next nodes launch in the other region and start a fresh
generation."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.jobs.models import TrainingJob
from controlplane.market.models import SpotPrice
from controlplane.orchestration import services
from controlplane.orchestration.models import Acquisition
from controlplane.orchestration.offerings import offerings_mark_no_capacity
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.base import Pool
from controlplane.orchestration.services.job_stop import job_stop_progress
from controlplane.orchestration.services.region_move import job_region_review
from tests.controlplane.factories import make_instance_type, make_job, make_team, make_zone
from tests.orchestration.test_provider_aws_regions import EAST, WEST, _provider

pytestmark = pytest.mark.django_db

EAST_ZONE, WEST_ZONE = "us-east-1a", "us-west-2a"


@pytest.fixture
def two_regions(ec2_regions, monkeypatch, settings, tmp_path):
    monkeypatch.setenv("SPOTPIPE_AWS_REGIONS", f"{EAST},{WEST}")
    monkeypatch.setenv("SPOTPIPE_ENROLL_VERIFY_IDENTITY", "off")  # moto's instances sign nothing
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    provider = _provider(ec2_regions)
    set_provider("aws", provider)
    itype = make_instance_type("g5.xlarge", on_demand="1.006")
    now = timezone.now()
    SpotPrice.objects.create(instance_type=itype, zone=make_zone(EAST_ZONE, "use1-az1"), price=Decimal("0.40"),
                             timestamp=now)
    SpotPrice.objects.create(instance_type=itype, zone=make_zone(WEST_ZONE, "usw2-az1"), price=Decimal("0.45"),
                             timestamp=now)
    yield provider
    set_provider("aws", None)


def _enroll_all(job: TrainingJob) -> None:
    for acquisition in Acquisition.objects.filter(job=job):
        key = services.acquisition_enroll_key(acquisition=acquisition)
        for instance in Instance.objects.filter(request_token__startswith=acquisition.request_token + "/",
                                                state="pending"):
            services.agent_enroll(enroll_key=key, provider_instance_id=instance.provider_instance_id)
    services.job_grow(job=job)


def _east_job_at_step_30_with_a_checkpoint_of_20(settings) -> tuple[TrainingJob, Path]:
    """A dp=2 job running on two east nodes, at step 30, whose newest complete checkpoint is step 20."""
    job = make_job(make_team(), target_steps=100, deadline=timezone.now() + timedelta(hours=2),
                   plan={"dp": 2, "pp": 1, "provider": "aws", "instance_types": ["g5.xlarge"],
                         "zones": [EAST_ZONE, WEST_ZONE]})
    services.acquisition_launch(acquisition=services.job_start(job=job))
    _enroll_all(job)
    TrainingJob.objects.filter(pk=job.pk).update(status="running", steps_done=30)
    checkpoint = Path(settings.SPOTPIPE_ARTIFACTS) / f"job-{job.pk}-{job.artifacts_key}" / "checkpoints" / "step-20"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"complete")  # what makes a checkpoint complete
    return job, checkpoint


def _states(client, ids: list[str]) -> set[str]:
    pages = client.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["State"]["Name"] for r in pages for i in r["Instances"]}


def test_a_job_whose_region_runs_dry_moves_to_the_other_from_its_checkpoint(two_regions, ec2_regions,
                                                                            monkeypatch, settings):
    monkeypatch.setenv("SPOTPIPE_REGION_PATIENCE_S", "60")
    job, checkpoint = _east_job_at_step_30_with_a_checkpoint_of_20(settings)
    east_ids = list(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
    assert _states(ec2_regions(EAST), east_ids) <= {"pending", "running"}

    # One east node is reclaimed and the east pool has no capacity: the job waits in its region.
    ec2_regions(EAST).terminate_instances(InstanceIds=[east_ids[0]])
    offerings_mark_no_capacity(provider="aws", pools=[Pool(instance_type="g5.xlarge", zone=EAST_ZONE)],
                               capacity_type="spot", code="InsufficientInstanceCapacity")
    report = services.capacity_reconcile(job=job)
    assert report["lost"] and report["moved_to"] is None and report["requested"] == 0
    job.refresh_from_db()
    assert job.events.filter(kind="capacity_wait").exists()
    assert job_region_review(job=job) is None  # within its patience

    # Past its patience: the node it still has writes a checkpoint of step 30 first (the job is
    # stopping, nothing is bought), and then it moves from that checkpoint.
    later = timezone.now() + timedelta(seconds=61)
    assert job_region_review(job=job, now=later) == WEST
    job.refresh_from_db()
    assert job.status == "stopping" and "then moving" in job.status_message
    assert not job.events.filter(kind="region_move").exists()
    assert services.capacity_reconcile(job=job)["requested"] == 0
    assert job_stop_progress(job=job, now=later) is False  # its checkpoint is not written yet
    written = checkpoint.parent / "step-30"
    written.mkdir()
    (written / "model.safetensors").write_bytes(b"complete")
    assert job_stop_progress(job=job, now=later + timedelta(seconds=5)) is True
    job.refresh_from_db()
    (move,) = job.events.filter(kind="region_move")
    assert (move.data["from"], move.data["to"], move.data["from_step"], move.data["steps_redone"]) == (
        EAST, WEST, 30, 0)
    assert move.data["usd_redone"] in (None, "0.0000")
    assert job.steps_done == 30 and job.config["init_from"].endswith("checkpoints/step-30")
    assert job.status == "recovering" and job.stop_requested_at is None and job.end_reason == ""
    assert _states(ec2_regions(EAST), east_ids[1:]) <= {"shutting-down", "terminated"}
    assert not Instance.objects.filter(job=job, state__in=["running", "pending", "notice"]).exists()

    # Its next nodes launch in the west and start a fresh generation (workers 0..n-1).
    services.capacity_reconcile(job=job)
    west = list(Instance.objects.filter(job=job, state="pending"))
    assert len(west) == 2 and {i.zone.region.code for i in west} == {WEST}
    assert _states(ec2_regions(WEST), [i.provider_instance_id for i in west]) <= {"pending", "running"}
    generation_before = TrainingJob.objects.get(pk=job.pk).current_generation
    _enroll_all(job)
    job.refresh_from_db()
    assert job.current_generation == generation_before + 1
    generation = job.generations.get(number=job.current_generation)
    assert {m["instance"] for m in generation.membership} == {i.pk for i in west}
    assert sorted(n for _, n in generation.layout["nodes"]) == [0, 1]


def test_a_job_without_a_checkpoint_does_not_move_and_says_so_once(two_regions, monkeypatch):
    monkeypatch.setenv("SPOTPIPE_REGION_PATIENCE_S", "0")
    job = make_job(make_team(), target_steps=100, deadline=timezone.now() + timedelta(hours=2),
                   plan={"dp": 1, "pp": 1, "nodes": 2, "provider": "aws", "instance_types": ["g5.xlarge"],
                         "zones": [EAST_ZONE, WEST_ZONE]})
    services.acquisition_launch(acquisition=services.job_start(job=job))
    _enroll_all(job)
    TrainingJob.objects.filter(pk=job.pk).update(status="running", steps_done=30)
    node = Instance.objects.filter(job=job).last()
    two_regions.terminate([node.provider_instance_id])
    offerings_mark_no_capacity(provider="aws", pools=[Pool(instance_type="g5.xlarge", zone=EAST_ZONE)],
                               capacity_type="spot", code="InsufficientInstanceCapacity")
    for _ in range(3):
        services.capacity_reconcile(job=job)
    job.refresh_from_db()
    assert not job.events.filter(kind="region_move").exists()
    assert job.events.filter(kind="region_move_blocked").count() == 1
    assert job.steps_done == 30


def test_a_move_whose_checkpoint_does_not_complete_goes_from_the_newest_complete_one(two_regions, ec2_regions,
                                                                                   monkeypatch, settings):
    monkeypatch.setenv("SPOTPIPE_REGION_PATIENCE_S", "0")
    job, _ = _east_job_at_step_30_with_a_checkpoint_of_20(settings)
    east_ids = list(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
    ec2_regions(EAST).terminate_instances(InstanceIds=[east_ids[0]])
    offerings_mark_no_capacity(provider="aws", pools=[Pool(instance_type="g5.xlarge", zone=EAST_ZONE)],
                               capacity_type="spot", code="InsufficientInstanceCapacity")
    services.capacity_reconcile(job=job)  # the loss, and the wait
    asked = timezone.now() + timedelta(seconds=1)
    job.refresh_from_db()
    assert job_region_review(job=job, now=asked) == WEST
    assert job.status == "stopping"

    assert job_stop_progress(job=job, now=asked + timedelta(seconds=30)) is False
    assert job_stop_progress(job=job, now=asked + timedelta(seconds=61)) is True  # SPOTPIPE_STOP_CHECKPOINT_WAIT_S
    job.refresh_from_db()
    (move,) = job.events.filter(kind="region_move")
    assert (move.data["from_step"], move.data["steps_redone"]) == (20, 10)
    assert job.status == "recovering" and job.steps_done == 20
    assert not Instance.objects.filter(job=job, state__in=["running", "pending", "notice"]).exists()
