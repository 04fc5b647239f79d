"""Experiment trackers of control-plane jobs (`tracking`): the control plane opens a run per tracker
with the job's contract, forwards each step's mean loss, validation loss, samples/s and generation
once the nodes reported it, and closes the run with the weights' location and the recoveries when
the job ends, with the credentials of its own environment only (MLflow on a local file store, W&B
offline here). A tracker it does not have, or cannot reach, is a clear 400 at submit, or a stored
error the next round retries, never a failed job."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobTracker, Reconfiguration, TrainingJob
from controlplane.jobs.services import job_record_metrics
from controlplane.jobs.tasks import forward_tracking
from controlplane.jobs.tracking import forward_open_trackers
from tests.controlplane.api_helpers import make_team_world, token_client

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 32}


@pytest.fixture
def world():
    return make_team_world()


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch) -> str:
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


def _submit(world, **extra):
    body = {"name": "tracked", "strategy": "recycle", "target_steps": 3, "config": CONFIG,
            "deadline": (timezone.now() + timedelta(hours=1)).isoformat(), **extra}
    return world.member_client.post("/api/v1/jobs/", body, format="json")


def _report(job: TrainingJob, step: int, *, loss: float, val: float | None = None, generation: int = 0) -> None:
    """Two nodes' reports of a step (the same all-reduced loss, their own rates)."""
    samples = [{"step": step, "loss": loss, "samples_per_s": rate, "generation": generation} for rate in (10.0, 30.0)]
    if val is not None:
        samples.append({"step": step, "val_loss": val, "generation": generation})
    job_record_metrics(job=job, samples=samples)


def test_mlflow_gets_the_contract_each_step_once_and_the_outcome(world, mlflow_store, settings, tmp_path):
    from mlflow.tracking import MlflowClient

    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    response = _submit(world, tracking=["mlflow"])
    assert response.status_code == 201, response.content
    assert response.json()["tracking"][0]["name"] == "mlflow" and not response.json()["tracking"][0]["run_id"]
    job = TrainingJob.objects.get(pk=response.json()["id"])
    _report(job, 1, loss=2.0)
    _report(job, 2, loss=1.5, val=1.75, generation=1)
    assert forward_tracking() == 1  # the beat task: step 1 goes; step 2 may still get reports
    tracker = JobTracker.objects.get(job=job)
    assert tracker.run_id and tracker.where == mlflow_store and tracker.last_step == 1 and not tracker.ended
    client = MlflowClient(tracking_uri=mlflow_store)
    run = client.get_run(tracker.run_id)
    assert run.data.params["config.model.kind"] == "mlp" and run.data.params["job.strategy"] == "recycle"
    assert run.data.params["job.id"] == str(job.pk)

    _report(job, 3, loss=1.0)
    Reconfiguration.objects.create(job=job, trigger="preemption", strategy="recycle", lost_seconds=2.5,
                                   decided_at=timezone.now(), applied_at=timezone.now())
    TrainingJob.objects.filter(pk=job.pk).update(status="finished", end_reason="finished")
    forward_open_trackers()
    forward_open_trackers()  # a closed run is left alone: nothing is sent twice
    tracker.refresh_from_db()
    assert tracker.ended and tracker.last_step == 3 and tracker.error == ""
    history = {m.step: m.value for m in client.get_metric_history(tracker.run_id, "loss")}
    assert history == {1: 2.0, 2: 1.5, 3: 1.0}
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "val_loss")] == [(2, 1.75)]
    assert {m.step: m.value for m in client.get_metric_history(tracker.run_id, "samples_per_s")} == {
        1: 20.0, 2: 20.0, 3: 20.0}  # the mean of the nodes' reports
    assert [m.value for m in client.get_metric_history(tracker.run_id, "generation")] == [0.0, 1.0, 0.0]
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["weights"] == str(tmp_path / "artifacts" / f"job-{job.pk}-{job.artifacts_key}")
    assert tags["status"] == "finished"
    assert (tags["recoveries"], tags["recovery_lost_s"]) == ("1", "2.5")
    # The API, `spotpipe status` and the job page name the run.
    from spotpipe.commands import describe_tracker

    shown = world.member_client.get(f"/api/v1/jobs/{job.pk}/").json()["tracking"]
    assert [(t["name"], t["run_id"], t["last_step"], t["ended"]) for t in shown] == [
        ("mlflow", tracker.run_id, 3, True)]
    line = describe_tracker(shown[0])
    assert line.startswith("tracking mlflow: run ") and tracker.run_id in line and "3 steps sent, closed" in line
    page = token_client()
    page.force_login(world.member)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="trackers-table"' in html and tracker.run_id in html and "closed" in html


def test_wandb_offline_gets_a_run_resumed_by_id_each_round(world, monkeypatch, settings, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings.VAR_DIR = tmp_path
    response = _submit(world, tracking=["wandb"])
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    _report(job, 1, loss=2.0)
    _report(job, 2, loss=1.5)
    forward_open_trackers()
    tracker = JobTracker.objects.get(job=job)
    first = tracker.run_id
    assert first and tracker.last_step == 1 and tracker.error == ""
    _report(job, 3, loss=1.0)
    TrainingJob.objects.filter(pk=job.pk).update(status="finished", end_reason="finished")
    forward_open_trackers()
    tracker.refresh_from_db()
    assert tracker.run_id == first and tracker.ended and tracker.last_step == 3, tracker.error
    files = Path(tracker.where)
    assert files.is_relative_to(tmp_path / "tracking") and list(files.rglob(f"run-{first}.wandb"))


def test_an_unreachable_tracker_keeps_its_cursor_and_says_why_without_a_secret(world, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:s3cret@127.0.0.1:9/")  # nothing listens on port 9
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    job = TrainingJob.objects.get(pk=_submit(world, tracking=["mlflow"]).json()["id"])
    _report(job, 1, loss=2.0)
    _report(job, 2, loss=1.5)
    forward_open_trackers()
    tracker = JobTracker.objects.get(job=job)
    assert tracker.error and "s3cret" not in tracker.error and tracker.last_step == 0 and not tracker.ended
    assert TrainingJob.objects.get(pk=job.pk).status != "failed"


@pytest.mark.parametrize(("tracking", "message"), [
    (["tensorboard"], "writes files where `spotpipe train` runs"),
    (["neptune"], "'neptune' is unknown; expected some of ['mlflow', 'wandb']"),
    (["mlflow", "mlflow"], "names 'mlflow' 2 times"),
    (["mlflow"], "this control plane has no MLFLOW_TRACKING_URI"),
    (["wandb"], "this control plane has no WANDB_API_KEY"),
    ("mlflow", "Expected a list of items"),
])
def test_a_tracker_the_control_plane_cannot_serve_is_a_400_and_nothing_is_stored(world, monkeypatch, tracking,
                                                                                  message):
    for name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    before = (TrainingJob.objects.count(), JobTracker.objects.count())
    response = _submit(world, tracking=tracking)
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()["errors"]["tracking"]), response.json()
    assert (TrainingJob.objects.count(), JobTracker.objects.count()) == before
