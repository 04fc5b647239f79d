"""docs/tutorial.md step 4, as written but for the wheel: its model file and job file, checked and
measured where the code is (`spotpipe submit`'s `validate_user_model`, with the data only on S3),
then sent to the control plane, whose planner chooses the plan of the model function from its
per-layer measures (`plan.auto`), within the job's deadline, budget and node limit."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from controlplane.jobs.models import TrainingJob
from runtime.config import JobConfig
from spotpipe.commands import validate_user_model
from spotpipe.jobfile import deadline_at_send, load_job_file
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def _block(kind: str) -> str:
    (block,) = re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.S)
    return block


def test_the_tutorials_job_file_is_auto_planned_from_its_models_measures(tmp_path: Path, monkeypatch, settings):
    (tmp_path / "tutorial_lm.py").write_text(_block("python"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # the corpus is on S3, out of reach here
    settings.SPOTPIPE_DATA_S3_CHECK = False  # nor can the control plane look it up
    job_file = _block("toml")
    assert "auto = true" in job_file and 'source = "text:s3://' in job_file
    # The wheel is uploaded before submitting (docs/api.md); no node starts here, so it is left out.
    (tmp_path / "job.toml").write_text("\n".join(line for line in job_file.splitlines()
                                                 if not line.startswith("requirements")))
    body = validate_user_model(load_job_file(tmp_path / "job.toml", at_send=True))
    sys.modules.pop("tutorial_lm", None)
    model = body["config"]["model"]
    assert model["layers"] == 4 and (model["seq_len"], model["vocab_size"]) == (64, 256)
    measures = model["layer_measures"]
    assert [m["parameters"] > 0 for m in measures] == [True] * 4 and measures[1]["forward_flops"] > 0
    assert measures[0]["input_grad"] is False  # token ids take no gradient

    world = make_team_world()
    response = world.member_client.post("/api/v1/jobs/", deadline_at_send(body), format="json")
    assert response.status_code == 201, response.content
    plan = response.json()["plan"]
    assert plan["chosen_by"] == "planner" and plan["nodes"] <= 4, plan
    assert 0 < plan["predicted"]["hours"] <= 2 and 0 < plan["predicted"]["cost_usd"] <= 5
    stored = JobConfig.from_dict(TrainingJob.objects.get(pk=response.json()["id"]).config)
    assert (stored.dp, stored.pp) == (plan["dp"], plan["pp"]) and stored.model.layer_measures
