"""The control plane finds a job's newest complete checkpoint in its artifact folder (local or S3),
with the runtime's own rule of what makes one complete (`runtime.checkpointing.durability.complete_steps`)."""

from __future__ import annotations

import pytest

from controlplane.jobs.artifacts import job_artifacts_location, job_latest_checkpoint
from controlplane.jobs.models import TrainingJob, new_artifacts_key
from runtime.checkpointing.durability import complete_steps
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db


def test_only_an_index_or_a_lone_model_file_completes_a_checkpoint():
    names = ["checkpoints/step-2/model.safetensors.index.json", "checkpoints/step-2/model-00001-of-00002.safetensors",
             "checkpoints/step-4/model.safetensors", "checkpoints/step-6/model-00001-of-00002.safetensors",
             "checkpoints/step-8/optimizer.safetensors", "model.safetensors", "checkpoints/step-x/model.safetensors"]
    assert complete_steps(names) == [2, 4]


def test_the_newest_complete_checkpoint_of_a_job(tmp_path, settings):
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path)
    job = make_job(make_team())
    assert job_latest_checkpoint(job=job) is None  # no folder yet
    root = tmp_path / f"job-{job.pk}-{job.artifacts_key}" / "checkpoints"
    for step, name in [(3, "model.safetensors"), (6, "model.safetensors.index.json"),
                       (9, "model-00001-of-00002.safetensors")]:  # step 9 is still being written
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / name).write_bytes(b"x")
    assert job_artifacts_location(job=job) == str(tmp_path / f"job-{job.pk}-{job.artifacts_key}")
    assert job_latest_checkpoint(job=job) == 6


def test_a_job_whose_id_an_earlier_database_used_sees_none_of_that_jobs_checkpoints(tmp_path, settings):
    # A reset database (or a second control plane on the same store) hands out job 1 again. The earlier
    # job 1's checkpoints must not be restored from, nor pruned by, the new one's workers: the chaos soak
    # run twice on one var dir once failed so, its new job's checkpoint writes pruned by the old, newer steps.
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path)
    job = make_job(make_team())
    earlier = tmp_path / f"job-{job.pk}-{new_artifacts_key()}" / "checkpoints" / "step-5396"
    earlier.mkdir(parents=True)
    (earlier / "model.safetensors").write_bytes(b"another job's weights")
    assert len(job.artifacts_key) == 8 and TrainingJob.objects.get(pk=job.pk).artifacts_key == job.artifacts_key
    assert job_latest_checkpoint(job=job) is None
    # A job made before the key existed keeps its folder, job-<id>, and what is in it.
    TrainingJob.objects.filter(pk=job.pk).update(artifacts_key="")
    legacy = TrainingJob.objects.get(pk=job.pk)
    (tmp_path / f"job-{job.pk}" / "checkpoints" / "step-4").mkdir(parents=True)
    (tmp_path / f"job-{job.pk}" / "checkpoints" / "step-4" / "model.safetensors").write_bytes(b"x")
    assert job_artifacts_location(job=legacy) == str(tmp_path / f"job-{job.pk}")
    assert job_latest_checkpoint(job=legacy) == 4


def test_an_unreachable_store_counts_as_no_checkpoint(settings, caplog):
    settings.SPOTPIPE_ARTIFACTS = "s3://spotpipe-test-bucket/artifacts"
    settings.SPOTPIPE_S3_ENDPOINT_URL = "http://127.0.0.1:1"  # nothing listens there
    job = make_job(make_team())
    assert job_latest_checkpoint(job=job) is None
    assert "checkpoints not listed" in caplog.text
