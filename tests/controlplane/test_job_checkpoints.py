"""The control plane finds a job's newest complete checkpoint in its artifact folder (local or S3),
with the runtime's own rule of what makes one complete (`runtime.checkpointing.durability.complete_steps`)."""

from __future__ import annotations

import pytest

from controlplane.jobs.artifacts import job_artifacts_location, job_latest_checkpoint
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
    root = tmp_path / f"job-{job.pk}" / "checkpoints"
    for step, name in [(3, "model.safetensors"), (6, "model.safetensors.index.json"),
                       (9, "model-00001-of-00002.safetensors")]:  # step 9 is still being written
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / name).write_bytes(b"x")
    assert job_artifacts_location(job=job) == str(tmp_path / f"job-{job.pk}")
    assert job_latest_checkpoint(job=job) == 6


def test_an_unreachable_store_counts_as_no_checkpoint(settings, caplog):
    settings.SPOTPIPE_ARTIFACTS = "s3://spotpipe-test-bucket/artifacts"
    settings.SPOTPIPE_S3_ENDPOINT_URL = "http://127.0.0.1:1"  # nothing listens there
    job = make_job(make_team())
    assert job_latest_checkpoint(job=job) is None
    assert "checkpoints not listed" in caplog.text
