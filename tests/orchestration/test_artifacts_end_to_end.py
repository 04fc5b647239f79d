"""A team leaves with its trained weights (issue 19), end to end on local nodes: the control
plane (live server), a real Celery worker and two local node agents running the torch runtime
(dp=2 x pp=1) train a USER model given by import path (`tests.usermodels.models:resmlp` on its
`py:` dataset). One node gets an interruption notice and leaves at a step boundary; the job trains
on and finishes. Its workers wrote the final weights into the job's folder of the artifact store
(the control plane handed it to them in the run command); the team downloads every file through
the API with its token (`spotpipe pull`; another team's token gets 404), and `spotpipe.load_model` on the downloaded
folder gives a module whose forward equals the failure-free single-process reference's.

Marker `scenario`: CI runs it in the PostgreSQL pass only; on the embedded default the headless
demo loads its job's exported weights and samples from them (tests/demo/test_demo_headless.py), and
the download views run in both passes (tests/controlplane/test_api_artifacts.py)."""

from __future__ import annotations

import hashlib
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.jobs.models import JobGeneration, JobStatus, Reconfiguration, TrainingJob
from controlplane.orchestration import tasks
from spotpipe import commands
from spotpipe.commands import validate_user_model
from tests.controlplane.api_helpers import make_api_token, make_api_user
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.test_end_to_end import STORY, Beat, local_nodes, stop_everything, wait_for
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture
from tests.usermodels.test_usermodels import assert_loaded_model_is_the_reference

M = "tests.usermodels.models"
STEPS = 200


def _get(url: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_a_user_models_weights_come_out_through_the_api_after_a_notice(
    control_plane, worker, tmp_path: Path, monkeypatch, settings  # noqa: F811
) -> None:
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    provider = local_nodes(tmp_path, monkeypatch, control_plane.url)
    team = make_team()
    token = make_api_token(team, user=make_api_user(team))
    other = make_team()
    stranger = make_api_token(other, user=make_api_user(other))
    beat = Beat()
    job = None
    try:
        # What `spotpipe submit` sends: the user model checked where its code is, its layer count
        # and profiled costs recorded in the contract (the control plane never imports it).
        body = validate_user_model({
            "config": {"model": {"kind": "py", "path": f"{M}:resmlp", "loss": f"{M}:huber",
                                 "args": {"width": 16, "blocks": 2}},
                       "data": {"source": f"py:{M}:regression"},
                       "global_batch": 8, "seed": 5, "lr": 0.01, "op_timeout_s": 2.0,
                       # Paced (about 0.1 s a step): unpaced, the 200 steps took 4 s, and the job
                       # could end before a loaded host's worker had applied the notice's
                       # reconfiguration (the check after it).
                       "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}},
            "plan": {"dp": 2, "pp": 1, "microbatches": 2, "provider": "local"},
        })
        assert body["config"]["model"]["layers"] == 4
        job = make_job(team, strategy="recycle", target_steps=STEPS, config=body["config"], plan=body["plan"])
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: JobGeneration.objects.filter(job=job, number=1).exists(), 60, "generation 1")
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).steps_done >= 10, 60, "training to start")

        # A notice: the node leaves at a step boundary, the job trains on.
        first = retrying(JobGeneration.objects.get, job=job, number=1)
        leaving = retrying(Instance.objects.get, pk=next(m["instance"] for m in first.membership
                                                         if m["pipeline"] == 1))
        provider.preempt(leaving.provider_instance_id, notice_s=4.0)
        wait_for(lambda: InterruptionNotice.objects.filter(provider_instance_id=leaving.provider_instance_id).exists(),
                 10, "the agent's notice")
        wait_for(lambda: Reconfiguration.objects.filter(job=job, instance=leaving, status="applied").exists(),
                 10, "the notice's reconfiguration")
        assert TrainingJob.objects.get(pk=job.pk).steps_done < STEPS, "the job ended before the notice"
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 120, "the job to finish")

        # The weights, through the API with the team's token.
        listing_url = f"{control_plane.url}/api/v1/jobs/{job.pk}/artifacts/"

        def complete() -> dict | None:
            code, body = _get(listing_url, token)
            listing = json.loads(body) if code == 200 else {}
            return listing if listing.get("complete") else None

        listing = wait_for(complete, 30, "the export to be complete")
        assert listing["location"] == str(tmp_path / "artifacts" / f"job-{job.pk}-{job.artifacts_key}")
        names = {f["name"] for f in listing["files"]}
        assert {"spotpipe.json", "model.safetensors"} <= names, names  # pp=1: one writer, one file
        assert any(n.startswith("optimizer") for n in names), names
        # `spotpipe pull`, as the team would: every file, its size and sha256 checked.
        downloaded = tmp_path / "downloaded"
        monkeypatch.setenv("SPOTPIPE_URL", control_plane.url)
        monkeypatch.setenv("SPOTPIPE_TOKEN", token)
        pulled, problems = io.StringIO(), io.StringIO()
        assert commands.pull(job.pk, downloaded, out=pulled, err=problems) == 0, problems.getvalue()
        for f in listing["files"]:
            data = (downloaded / f["name"]).read_bytes()
            assert len(data) == f["size"] and hashlib.sha256(data).hexdigest() == f["sha256"]
            assert _get(f["url"], stranger)[0] == 404
        assert _get(listing_url, stranger)[0] == 404
        info = json.loads((downloaded / "spotpipe.json").read_text())
        assert info["steps_done"] == STEPS and info["model"]["path"] == f"{M}:resmlp"

        # The loaded module's forward equals the single-process reference model's.
        assert_loaded_model_is_the_reference(downloaded)
    finally:
        beat.stop.set()
        stop_everything(provider, job)
