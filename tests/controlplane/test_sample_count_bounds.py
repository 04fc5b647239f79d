"""A job's samples done (step * global_batch) fit the signed 64-bit column that holds them: a
global_batch past `runtime.config.MAX_GLOBAL_BATCH` is refused at submit naming the field, and a
metrics batch of a job stored before that bound answers 400 naming the step, never a 500 the agent
would retry forever."""

from __future__ import annotations

import pytest

from controlplane.jobs.models import JobEvent, MetricSample, TrainingJob
from runtime.config import MAX_GLOBAL_BATCH
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 32}
LAST_STEP = 2**31 - 1  # the highest step a metrics batch may carry


@pytest.fixture
def world():
    return make_team_world()


def _submit(world, **config):
    return world.member_client.post("/api/v1/jobs/", {
        "name": "huge-batch", "strategy": "recycle", "target_steps": 60, "budget_usd": "10",
        "config": {**CONFIG, **config}, "plan": {"dp": 1, "pp": 1, "microbatches": 4},
    }, format="json")


def test_a_global_batch_past_the_bound_is_refused_naming_the_field(world):
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    for too_big in (2**52, MAX_GLOBAL_BATCH * 2):
        response = _submit(world, global_batch=too_big)
        assert response.status_code == 400, response.content
        errors = response.json()["errors"]
        assert list(errors) == ["config.global_batch"] and str(MAX_GLOBAL_BATCH) in errors["config.global_batch"][0]
    legacy = world.member_client.post("/api/v1/jobs/", {
        "name": "huge-batch", "strategy": "recycle", "target_steps": 60, "budget_usd": "10",
        "model_spec": {"kind": "mlp", "layers": 2, "d_model": 16, "global_batch": 2**52, "micro_batches": 4},
    }, format="json")
    assert legacy.status_code == 400 and "model_spec.global_batch" in legacy.json()["errors"], legacy.content
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


def test_the_largest_global_batch_counts_samples_up_to_the_last_step(world):
    response = _submit(world, global_batch=MAX_GLOBAL_BATCH)
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    stored = world.member_client.post(f"/api/v1/jobs/{job.pk}/metrics/", [{"step": LAST_STEP, "loss": 1.0}],
                                      format="json")
    assert stored.status_code == 201, stored.content
    job.refresh_from_db()
    assert job.samples_done == LAST_STEP * MAX_GLOBAL_BATCH < 2**63


def test_a_step_past_what_a_job_stored_before_the_bound_can_count_is_a_400(world):
    job = world.job
    TrainingJob.objects.filter(pk=job.pk).update(config={**job.config, "global_batch": 2**52})
    url = f"/api/v1/jobs/{job.pk}/metrics/"
    refused = world.agent_client.post(url, [{"step": 2047, "loss": 2.0}, {"step": 2048, "loss": 1.0}], format="json")
    assert refused.status_code == 400, refused.content
    assert list(refused.json()["errors"]) == ["samples[1].step"], refused.json()
    assert MetricSample.objects.filter(job=job).count() == 0  # all or nothing
    assert world.agent_client.post(url, [{"step": 2047, "loss": 2.0}], format="json").status_code == 201
    job.refresh_from_db()
    assert job.samples_done == 2047 * 2**52
    out_of_range = world.agent_client.post(url, [{"step": 2**31, "loss": 1.0}], format="json")
    assert out_of_range.status_code == 400 and list(out_of_range.json()["errors"]) == ["samples[0].step"]
