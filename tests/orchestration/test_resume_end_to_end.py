"""A cancelled job resumed through the API, end to end (issue 39, "no node paid for without work"):
control plane, a real Celery worker, local agents training. The job is cancelled after a checkpoint,
its nodes are released; `POST /jobs/{id}/resume/` answers from which step it continues; the nodes
it acquires reach a new generation (none stands by), and the job finishes with every parameter
equal to the failure-free run of its seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from controlplane.fleet.models import Instance
from controlplane.jobs.artifacts import job_latest_checkpoint
from controlplane.jobs.models import JobGeneration, JobStatus, TrainingJob
from controlplane.jobs.services import job_cancel
from controlplane.orchestration import tasks
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.provider import LocalProvider
from runtime.config import JobConfig
from runtime.train.reference import train_reference
from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.test_end_to_end import STORY, Beat, stop_everything, wait_for
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

STEPS = 120


def _params_of(nodes_dir: Path, node_ids: list[str]) -> dict[str, list[torch.Tensor]]:
    copies: dict[str, list[torch.Tensor]] = {}
    for node_id in node_ids:
        for path in sorted((nodes_dir / node_id).glob("work/out/node-*.pt")):
            for name, tensor in torch.load(path)["params"].items():
                copies.setdefault(name, []).append(tensor)
    return copies


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_cancelled_job_resumed_continues_from_its_checkpoint_with_the_same_math(control_plane, worker,  # noqa: F811
                                                                                  tmp_path, monkeypatch, settings):
    nodes_dir = tmp_path / "nodes"
    provider = LocalProvider(nodes_dir, start_timeout_s=30)
    set_provider("local", provider)
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "process")
    monkeypatch.setenv("SPOTPIPE_PUBLIC_URL", control_plane.url)
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "5.0")
    beat = Beat()
    job = None
    try:
        team = make_team()
        job = make_job(team, strategy="recycle", target_steps=STEPS,
                       config={"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8, "seed": 3,
                               "op_timeout_s": 2.0, "checkpoint_interval": 10,
                               "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}},
                       plan={"dp": 2, "pp": 2, "microbatches": 2, "provider": "local"})
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: (job_latest_checkpoint(job=job) or 0) >= 20, 120, "a checkpoint of step 20 or later")

        retrying(job_cancel, job=TrainingJob.objects.get(pk=job.pk), user=None)
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=["running", "pending", "notice"]).exists(),
                 60, "every node released")
        first_nodes = set(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
        checkpoint = job_latest_checkpoint(job=job)
        assert checkpoint is not None and checkpoint < STEPS

        api = token_client(make_api_token(team, user=make_api_user(team)))
        answer = retrying(api.post, f"/api/v1/jobs/{job.pk}/resume/", {}, format="json")
        assert answer.status_code == 200, answer.content
        assert answer.json()["resumed_from"]["step"] == checkpoint and answer.json()["resumed_from"]["checkpoint"]
        assert answer.json()["steps_done"] == checkpoint
        generation_before = TrainingJob.objects.get(pk=job.pk).current_generation

        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).current_generation > generation_before, 90,
                 "a new generation on the resumed job's nodes")
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 150, "the job to finish")
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=["running", "pending", "notice"]).exists(),
                 30, "every node released")

        new_nodes = sorted(set(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
                           - first_nodes)
        assert len(new_nodes) == 4
        generation = JobGeneration.objects.get(job=job, number=generation_before + 1)
        assert {m["instance"] for m in generation.membership} == set(
            Instance.objects.filter(provider_instance_id__in=new_nodes).values_list("pk", flat=True))
        config = JobConfig.from_dict(TrainingJob.objects.get(pk=job.pk).config)
        assert config.init_from.endswith(f"checkpoints/step-{checkpoint}")
        reference, _ = train_reference(JobConfig.from_dict({**config.to_dict(), "init_from": ""}))
        copies = _params_of(nodes_dir, new_nodes)
        assert set(copies) == set(reference)
        for name, expected in reference.items():
            for copy in copies[name]:
                torch.testing.assert_close(copy, expected, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        beat.stop.set()
        stop_everything(provider, job)
