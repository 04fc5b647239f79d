"""Money a team can trust, end to end (issue 39): control plane, a real Celery worker, local agents
training on the runtime. A job whose spend reaches its budget checkpoints, releases every node and
ends `stopped` (`end_reason` budget) with nothing left paid; resumed with
a larger budget it finishes with every parameter equal to an uninterrupted run's. A second job over
its team's quota waits `queued` and is admitted when the first ends; its `max_runtime_s` stops it
with that reason."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
import torch
from django.utils import timezone

from controlplane.accounts.models import TeamQuota
from controlplane.billing.metering import job_meter
from controlplane.fleet.models import Instance
from controlplane.jobs.artifacts import job_latest_checkpoint
from controlplane.jobs.models import EndReason, JobEvent, JobStatus, TrainingJob
from controlplane.market.models import SpotPool, SpotPrice
from controlplane.orchestration import tasks
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.provider import LocalProvider
from controlplane.orchestration.services.catalogue import _instance_type_row, _zone_row
from runtime.config import JobConfig
from runtime.train.reference import train_reference
from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.test_end_to_end import STORY, Beat, stop_everything, wait_for
from tests.orchestration.test_resume_end_to_end import _params_of
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

STEPS = 200
LIVE = ["running", "pending", "notice", "requested"]
# No periodic checkpoint within the runs (every 1,000 steps): a checkpoint is the stop's own.
CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8, "seed": 5, "op_timeout_s": 2.0,
          "checkpoint_interval": 1000,
          "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}}


def _local(tmp_path, monkeypatch, settings, control_plane) -> LocalProvider:
    provider = LocalProvider(tmp_path / "nodes", start_timeout_s=30)
    set_provider("local", provider)
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "process")
    monkeypatch.setenv("SPOTPIPE_PUBLIC_URL", control_plane.url)
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "5.0")
    # A loaded machine may take long to write a checkpoint: the stop waits for it rather than give up.
    monkeypatch.setenv("SPOTPIPE_STOP_CHECKPOINT_WAIT_S", "150")
    # Local nodes priced as a spot node at $36/h ($0.01 a second), so budgets meet real spend.
    # (as `spotpipe.demo.seed` prices them for the demo).
    local_type, local_zone = _instance_type_row("local", "local.node"), _zone_row("local", "local")
    at = timezone.now() - timedelta(hours=1)
    SpotPrice.objects.create(instance_type=local_type, zone=local_zone, product="Linux/UNIX", price=Decimal("36"),
                             timestamp=at)
    SpotPool.objects.update_or_create(instance_type=local_type, zone=local_zone, product="Linux/UNIX",
                                      defaults={"latest_timestamp": at, "latest_price": Decimal("36")})
    return provider


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(420)
def test_a_job_stopped_at_its_budget_resumes_and_ends_with_the_same_math(control_plane, worker,  # noqa: F811
                                                                         tmp_path, monkeypatch, settings):
    provider = _local(tmp_path, monkeypatch, settings, control_plane)
    beat = Beat()
    job = None
    try:
        team = make_team()
        job = make_job(team, strategy="recycle", target_steps=STEPS, config=CONFIG, budget_usd=Decimal("1000"),
                       plan={"dp": 2, "pp": 2, "microbatches": 2, "provider": "local", "zones": ["local"]})
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).steps_done >= 10, 150, "10 steps trained")
        # The budget is set to just above what is spent: the next reconcile stops the job.
        meter = job_meter(job_id=job.pk, at=timezone.now())
        assert meter.usd_per_hour == Decimal("144"), meter  # 4 nodes at $36/h
        budget = (meter.spent_usd + Decimal("0.05")).quantize(Decimal("0.01"))
        TrainingJob.objects.filter(pk=job.pk).update(budget_usd=budget)
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.STOPPED, 180, "the budget stop")
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=LIVE).exists(), 60, "every node released")

        stopped = TrainingJob.objects.get(pk=job.pk)
        assert stopped.end_reason == EndReason.BUDGET and stopped.steps_done < STEPS, stopped.status_message
        event = JobEvent.objects.get(job=job, kind="job_stopped")
        asked = JobEvent.objects.get(job=job, kind="job_stopping")
        checkpoint = job_latest_checkpoint(job=job)
        assert event.data["checkpoint_written"] is True and checkpoint == event.data["checkpoint"]
        assert checkpoint >= asked.data["at_step"]  # the stop's own (no periodic checkpoint this early)
        # Nothing is paid any more: every billing segment is closed. (How far past the cap the spend
        # went is a timing figure: `python -m bench money` measures it, not this test.)
        assert job_meter(job_id=job.pk, at=timezone.now()).usd_per_hour == 0
        first_nodes = set(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))

        api = token_client(make_api_token(team, user=make_api_user(team)))
        assert retrying(api.post, f"/api/v1/jobs/{job.pk}/resume/", {}, format="json").status_code == 409
        answer = retrying(api.post, f"/api/v1/jobs/{job.pk}/resume/", {"budget_usd": "1000.00"}, format="json")
        assert answer.status_code == 200, answer.content
        assert answer.json()["resumed_from"]["step"] == checkpoint
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 200, "the job to finish")
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=LIVE).exists(), 60, "every node released")

        new_nodes = sorted(set(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
                           - first_nodes)
        config = JobConfig.from_dict(TrainingJob.objects.get(pk=job.pk).config)
        assert config.init_from.endswith(f"checkpoints/step-{checkpoint}")
        reference, _ = train_reference(JobConfig.from_dict({**config.to_dict(), "init_from": ""}))
        copies = _params_of(tmp_path / "nodes", new_nodes)
        assert set(copies) == set(reference)
        for name, expected in reference.items():
            for copy in copies[name]:
                torch.testing.assert_close(copy, expected, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        beat.stop.set()
        stop_everything(provider, job)


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(420)
def test_a_job_over_quota_waits_queued_and_its_max_runtime_stops_it(control_plane, worker,  # noqa: F811
                                                                    tmp_path, monkeypatch, settings):
    provider = _local(tmp_path, monkeypatch, settings, control_plane)
    beat = Beat()
    first = second = None
    try:
        team = make_team()
        TeamQuota.objects.create(team=team, max_jobs=1)
        plan = {"dp": 1, "pp": 2, "microbatches": 2, "provider": "local", "zones": ["local"]}
        first = make_job(team, strategy="recycle", target_steps=30, config=CONFIG, plan=plan)
        second = make_job(team, strategy="recycle", target_steps=100_000, config=CONFIG, plan=plan,
                          max_runtime_s=15, budget_usd=Decimal("1000"))
        assert (first.status, second.status) == (JobStatus.PENDING, JobStatus.QUEUED)
        STORY[:] = [first.pk, second.pk]
        beat.start()
        wait_for(lambda: TrainingJob.objects.get(pk=first.pk).status == JobStatus.FINISHED, 200, "the first job")
        assert TrainingJob.objects.get(pk=second.pk).status in (JobStatus.QUEUED, JobStatus.PENDING,
                                                               JobStatus.PROVISIONING)
        wait_for(lambda: JobEvent.objects.filter(job=second, kind="admitted").exists(), 60, "the second admitted")
        finished_at = TrainingJob.objects.get(pk=first.pk).finished_at
        admitted_at = JobEvent.objects.get(job=second, kind="admitted").at
        assert admitted_at >= finished_at
        wait_for(lambda: TrainingJob.objects.get(pk=second.pk).status == JobStatus.STOPPED, 240,
                 "the second job's max_runtime stop")
        stopped = TrainingJob.objects.get(pk=second.pk)
        assert stopped.end_reason == EndReason.MAX_RUNTIME and 0 < stopped.steps_done < 100_000
        assert JobEvent.objects.get(job=second, kind="job_stopped").data["checkpoint_written"] is True
        wait_for(lambda: not Instance.objects.filter(job=second, state__in=LIVE).exists(), 60, "its nodes released")
    finally:
        beat.stop.set()
        stop_everything(provider, second)
        stop_everything(provider, first)


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_worker_crashes_beyond_max_restarts_end_the_job_as_a_user_error(control_plane, worker,  # noqa: F811
                                                                         tmp_path, monkeypatch, settings):
    """A user model whose loss raises a few steps in: each crash is reported with the log's last
    lines; the agent restarts the worker once (max_restarts_on_errors=1) and the next crash ends the
    job `failed`, `end_reason` user_error, with the exit code and the traceback's last line."""
    from spotpipe.commands import validate_user_model

    provider = _local(tmp_path, monkeypatch, settings, control_plane)
    beat = Beat()
    job = None
    models = "tests.usermodels.models"
    try:
        body = validate_user_model({
            "config": {"model": {"kind": "py", "path": f"{models}:resmlp", "loss": f"{models}:crashing_huber",
                                 "args": {"width": 16, "blocks": 2}},
                       "data": {"source": f"py:{models}:regression"}, "global_batch": 8, "seed": 5,
                       "op_timeout_s": 2.0},
            "plan": {"dp": 2, "pp": 1, "microbatches": 2, "provider": "local", "zones": ["local"]},
        })
        job = make_job(make_team(), strategy="recycle", target_steps=200, config=body["config"], plan=body["plan"],
                       max_restarts_on_errors=1, budget_usd=Decimal("1000"))
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FAILED, 240, "the job to fail")
        failed = TrainingJob.objects.get(pk=job.pk)
        assert failed.end_reason == EndReason.USER_ERROR and failed.exit_code == 1, failed.status_message
        assert "ValueError: bad batch" in failed.end_log
        crashes = JobEvent.objects.filter(job=job, kind="agent_worker_exit", data__code=1)
        assert crashes.count() >= 2 and all(e.data.get("log_tail") for e in crashes)
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=LIVE).exists(), 60, "every node released")
    finally:
        beat.stop.set()
        stop_everything(provider, job)


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_node_standing_by_with_no_generation_coming_is_released(control_plane, worker,  # noqa: F811
                                                                   tmp_path, monkeypatch, settings):
    """The safety net behind every path that should give a node work: a replacement joins a job
    whose generation never takes it (a control-plane bug, simulated: the join reaction takes no
    one). Its agent is told to stand by; after SPOTPIPE_STANDBY_LIMIT_S it is released with a
    `standby_released` event, paid no longer than the limit and a reconcile or two."""
    from controlplane.orchestration import reactions

    provider = _local(tmp_path, monkeypatch, settings, control_plane)
    monkeypatch.setenv("SPOTPIPE_STANDBY_LIMIT_S", "10")
    monkeypatch.setattr(reactions, "react_join", lambda config, slots, joiners: reactions.Reaction(
        decision="wait", slots=None, reason="simulated: no generation takes a joiner"))
    beat = Beat()
    job = None
    try:
        job = make_job(make_team(), strategy="recycle", target_steps=100_000, config=CONFIG, budget_usd=Decimal("1000"),
                       plan={"dp": 2, "pp": 2, "microbatches": 2, "provider": "local", "zones": ["local"]})
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).steps_done >= 10, 150, "training to start")
        victim = Instance.objects.filter(job=job, state="running").order_by("id")[1]
        provider.kill(victim.provider_instance_id)  # stage 1 of pipeline 0: recycle reroutes around it
        wait_for(lambda: Instance.objects.filter(job=job, state="running").exclude(
            pk__in=[i.pk for i in Instance.objects.filter(job=job).order_by("id")[:4]]).exists(), 120,
            "a replacement running")
        wait_for(lambda: JobEvent.objects.filter(job=job, kind="standby_released").exists(), 120,
                 "the standing-by replacement released")
        event = JobEvent.objects.filter(job=job, kind="standby_released").order_by("id").first()
        released = Instance.objects.get(pk=event.data["instance"])
        assert released.state == "terminated" and released.pk not in {i.pk for i in
                                                                      Instance.objects.filter(job=job)[:4]}
        assert event.data["standby_s"] >= 10, event.data  # not before the limit (how soon after: bench money)
        told = [json.loads(line)["action"] for line in
                (provider.node_dir(released.provider_instance_id) / "work" / "commands.jsonl").read_text().splitlines()]
        assert "standby" in told, told
    finally:
        beat.stop.set()
        stop_everything(provider, job)
