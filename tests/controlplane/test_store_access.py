"""A job's contract names places inside the artifact store only within its own team's jobs'
folders (controlplane/jobs/store_access.py): another team's weights, the packages and the store's
root are refused at submit with a 400 naming the field, the same answer whether the folder exists
or not, and nothing is written."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.jobs.artifacts import job_artifacts_location
from controlplane.jobs.models import TrainingJob
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_job

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 32,
          "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}}


def _submit(world, **config):
    return world.member_client.post("/api/v1/jobs/", {
        "name": "reader", "strategy": "recycle", "target_steps": 6, "config": {**CONFIG, **config},
        "plan": {"dp": 1, "pp": 1}, "deadline": (timezone.now() + timedelta(hours=1)).isoformat(),
    }, format="json")


def _refused(response, field: str) -> None:
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert "outside your team's jobs' folders" in " ".join(response.json()["errors"][field])


@pytest.mark.parametrize("store", ["local", "s3"])
def test_another_teams_folders_the_packages_and_the_root_are_refused(settings, tmp_path, store):
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "store") if store == "local" else "s3://shared-store/runs"
    settings.SPOTPIPE_DATA_S3_CHECK = False
    theirs, ours = make_team_world("theirs"), make_team_world("ours")
    folder = job_artifacts_location(job=make_job(theirs.team))
    root = settings.SPOTPIPE_ARTIFACTS
    made_up = f"{root}/job-999999-0123abcd"  # no such job: the same answer as a real one
    before = TrainingJob.objects.count()
    for field, config in [
        ("config.init_from", {"init_from": folder}),
        ("config.init_from", {"init_from": f"{folder}/checkpoints/step-4"}),
        ("config.init_from", {"init_from": made_up}),
        ("config.data.source", {"data": {"source": f"text:{folder}/corpus.txt"}}),
        ("config.data.source", {"data": {"source": f"text:{root}/job-*/model.safetensors"}}),
        ("config.data.prepare", {"data": {"source": "text:corpus.txt", "prepare": f"{folder}/prepared/"}}),
        ("config.checkpoint_dir", {"checkpoint_dir": root}),
        ("config.init_from", {"init_from": f"{root}/packages"}),
    ]:
        _refused(_submit(ours, **config), field)
    if store == "local":  # a path that walks out of a folder of its own and into theirs
        _refused(_submit(ours, init_from=f"{root}/unrelated/../{folder.rsplit('/', 1)[1]}"), "config.init_from")
    else:  # a differently-cased bucket is the same bucket
        _refused(_submit(ours, init_from=folder.replace("shared-store", "Shared-Store")), "config.init_from")
    assert TrainingJob.objects.count() == before


def test_a_teams_own_jobs_folders_and_places_outside_the_store_are_accepted(settings, tmp_path):
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "store")
    ours = make_team_world("ours")
    own = job_artifacts_location(job=make_job(ours.team))
    for config in ({"init_from": own}, {"init_from": f"{own}/checkpoints/step-4"},
                   {"init_from": str(tmp_path / "elsewhere")}, {"init_from": f"{tmp_path}/store-not-the-store"}):
        response = _submit(ours, **config)
        assert response.status_code == 201, (config, response.content)
