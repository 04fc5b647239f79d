"""A job file from submit to trained, on local nodes: `spotpipe submit` (a real client
process) sends a job with `plan.auto` and a deadline one node cannot meet to a live control plane;
the planner's layout (dp x pp > 1) runs on the planned number of local nodes; `spotpipe logs
--follow` prints its timeline to the end; the job page shows the plan with its predicted and
measured figures; the job's MLflow run (`tracking`) gets every step the nodes reported. A bad job
file gets the API's own 400 messages from the client.

Marker `scenario`: CI runs it in the PostgreSQL pass only, with the other end-to-end runs; on the
embedded default the headless demo (tests/demo/) submits through the same service (`job_submit`,
with an explicit plan) and the planner's choice for a deadline is tested in both passes
(tests/controlplane/test_job_contract.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.jobs.models import JobGeneration, JobStatus, JobTracker, TrainingJob
from controlplane.jobs.tracking import forward_open_trackers
from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client
from tests.controlplane.factories import make_team
from tests.orchestration.test_end_to_end import Beat, local_nodes, stop_everything
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

JOB_FILE = """
name = "deadline-from-a-file"
strategy = "recycle"
target_steps = 60
deadline = "{deadline}"

[config]
global_batch = 32
seed = 2
op_timeout_s = 2.0
[config.model]
kind = "mlp"
n_layer = 2
n_embd = 16
[config.device_time]
forward_ms = 4
backward_input_ms = 4
backward_weight_ms = 4

[plan]
auto = true
max_nodes = 4
"""


def _cli(*args: str, url: str, token: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPOTPIPE_URL": url, "SPOTPIPE_TOKEN": token, "SPOTPIPE_CONFIG": "/nonexistent"}
    return subprocess.run([sys.executable, "-m", "spotpipe.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_a_job_file_is_planned_for_its_deadline_and_trains_on_the_planned_nodes(
    control_plane, worker, tmp_path: Path, monkeypatch  # noqa: F811
) -> None:
    provider = local_nodes(tmp_path, monkeypatch, control_plane.url)
    team = make_team()
    user = make_api_user(team)
    token = make_api_token(team, user=user)
    # The control plane logs the job to MLflow with its own environment's URI (a file store here).
    mlflow_uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # One node takes 60 steps x 4 micro-batches x 4 layers x 12 ms = 11.5 s by the plan's profile.
    job_file = tmp_path / "job.toml"
    job_file.write_text('tracking = ["mlflow"]\n' + JOB_FILE.format(deadline="8s"))
    beat = Beat()
    job = None
    try:
        submitted = _cli("submit", str(job_file), url=control_plane.url, token=token)
        assert submitted.returncode == 0, submitted.stderr
        assert "planner plan:" in submitted.stdout, submitted.stdout
        job = retrying(TrainingJob.objects.get, name="deadline-from-a-file")
        plan = job.plan
        layout = job.config  # the layout's one home; the plan says where the nodes come from
        assert plan["chosen_by"] == "planner" and layout["dp"] * layout["pp"] > 1, plan
        assert plan["predicted"]["hours"] * 3600 < 8
        beat.start()  # the periodic reconcile starts the pending job, as in production

        followed = _cli("logs", str(job.pk), "--follow", url=control_plane.url, token=token)
        assert followed.returncode == 0, followed.stdout + followed.stderr
        assert "job_finished" in followed.stdout and "generation" in followed.stdout
        job = retrying(TrainingJob.objects.get, pk=job.pk)
        assert job.status == JobStatus.FINISHED and job.steps_done >= job.target_steps
        first = retrying(JobGeneration.objects.get, job=job, number=1)
        assert (first.layout["dp"], first.layout["pp"]) == (layout["dp"], layout["pp"])
        assert len(first.membership) == plan["nodes"]  # the planned number of local nodes trained it
        assert len({m["instance"] for m in first.membership}) == plan["nodes"]

        page = token_client()
        page.force_login(user)
        html = page.get(f"/jobs/{job.pk}/").content.decode()
        assert "Chosen by the planner" in html and f"dp={layout['dp']} x pp={layout['pp']}" in html
        empty = "<td>\N{EN DASH}</td>"
        assert html.count(empty) < 4  # the plan table has predicted and measured figures filled in

        # Its metrics, as the nodes reported them, reach its MLflow run (beat's round, run here).
        from mlflow.tracking import MlflowClient

        forward_open_trackers()
        tracker = JobTracker.objects.get(job=job)
        assert tracker.ended and tracker.last_step == job.steps_done, tracker.error
        losses = MlflowClient(tracking_uri=mlflow_uri).get_metric_history(tracker.run_id, "loss")
        assert sorted(m.step for m in losses) == list(range(1, job.steps_done + 1))
        assert MlflowClient(tracking_uri=mlflow_uri).get_run(tracker.run_id).data.tags["status"] == "finished"
    finally:
        beat.stop.set()
        stop_everything(provider, job)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_bad_job_file_gets_the_apis_own_messages(control_plane, tmp_path: Path) -> None:
    team = make_team()
    user = make_api_user(team)
    token = make_api_token(team, user=user)
    job_file = tmp_path / "bad.toml"
    job_file.write_text(JOB_FILE.format(deadline="1h").replace("auto = true", "dp = 1\npp = 9")
                        .replace("max_nodes = 4", "").replace("n_embd = 16", "n_embd = 16\nn_head = 0"))
    result = _cli("submit", str(job_file), url=control_plane.url, token=token)
    assert result.returncode == 1
    # What the API answers for the same body, field by field.
    from spotpipe.jobfile import load_job_file

    client = token_client(token)
    api = client.post("/api/v1/jobs/", load_job_file(job_file), format="json").json()
    assert {"plan.pp", "config.model.n_head"} <= set(api["errors"])
    for field, messages in api["errors"].items():
        for message in messages:
            assert f"  {field}: {message}" in result.stderr, result.stderr
    assert not retrying(TrainingJob.objects.filter(team=team).exists)

    unreadable = tmp_path / "broken.toml"
    unreadable.write_text("name = \n")
    result = _cli("submit", str(unreadable), url=control_plane.url, token=token)
    assert result.returncode == 2 and "not a TOML file" in result.stderr
