"""Money a team can trust (issue 39), on the services: spend metered from the ledger, budgets and
limits that stop a job through `stopping` with a checkpoint, crash limits, resume with a new budget,
and a team's queue under its quota (API and `manage.py set_quota`). Both databases."""

from __future__ import annotations

import io
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from controlplane.accounts.models import Role, TeamQuota
from controlplane.billing.metering import job_meter, team_month_meter
from controlplane.billing.models import BillingSegment, PriceSource
from controlplane.fleet.models import Instance
from controlplane.jobs.admission import queue_admit, queue_positions
from controlplane.jobs.artifacts import job_artifacts_location
from controlplane.jobs.models import EndReason, JobEvent, JobGeneration, JobStatus, TrainingJob
from controlplane.jobs.services import job_cancel, job_set_status
from controlplane.orchestration.services.job_end import worker_exit_report
from controlplane.orchestration.services.job_stop import give_back_quota, job_stop_progress
from controlplane.orchestration.services.limits import job_limits_review
from controlplane.orchestration.services.standby import standby_review
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertDelivery
from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client
from tests.controlplane.factories import make_instance, make_job, make_team

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


@pytest.fixture
def worker_free_provider(settings):
    """The in-memory provider as the local one (no node processes), alerts allowed to loopback."""
    from controlplane.orchestration.providers import set_provider
    from tests.orchestration.fakes import FakeProvider

    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    provider = FakeProvider()
    set_provider("local", provider)
    yield provider
    set_provider("local", None)


def _billed(job: TrainingJob, *, price: str = "10", hours: float = 1.0, nodes: int = 1) -> list:
    """`nodes` running nodes of the job, each billed at `price` per hour for the last `hours`."""
    now = timezone.now()
    instances = []
    for _ in range(nodes):
        instance = make_instance(job.team, job=job, state="running")
        BillingSegment.objects.create(instance=instance, team=job.team, job=job, start=now - hours * HOUR, end=None,
                                      price_per_hour=Decimal(price), price_source=PriceSource.SPOT)
        instances.append(instance)
    return instances


def _training(team, **fields) -> TrainingJob:
    job = make_job(team, status="running", current_generation=1, steps_done=40, **fields)
    JobEvent.objects.filter(job=job, kind="submitted").update(at=timezone.now() - 2 * HOUR)
    JobGeneration.objects.create(job=job, number=1, membership=[], layout={}, created_at=timezone.now() - HOUR)
    return job


def test_spend_is_metered_from_the_ledger_to_the_second():
    job = make_job(make_team())
    _billed(job, price="10", hours=1, nodes=2)
    at = timezone.now()
    meter = job_meter(job_id=job.pk, at=at)
    assert Decimal("19.99") < meter.spent_usd < Decimal("20.01")
    assert meter.usd_per_hour == Decimal("20")
    assert meter.projected(3600) - meter.spent_usd == Decimal("20")
    month = team_month_meter(team_id=job.team_id, at=at)  # less when the month began within the hour
    assert month.usd_per_hour == Decimal("20") and month.spent_usd <= meter.spent_usd


def test_a_budget_stops_a_training_job_before_the_cap_with_its_checkpoint(settings, tmp_path):
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    # $10 spent at $10/h: 60 s of margin is $0.17, so a $10.15 budget is reached now, $10.50 is not.
    job = _training(make_team(), budget_usd=Decimal("10.50"))
    _billed(job)
    assert job_limits_review(job=job) is None
    TrainingJob.objects.filter(pk=job.pk).update(budget_usd=Decimal("10.15"))
    job.refresh_from_db()
    assert job_limits_review(job=job) == EndReason.BUDGET
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPING and job.end_reason == EndReason.BUDGET and job.stop_requested_at
    asked = JobEvent.objects.get(job=job, kind="job_stopping")
    assert asked.data["at_step"] == 40 and asked.data["budget_of"] == "job"
    assert job_limits_review(job=job) is None  # asked once

    assert job_stop_progress(job=job) is False  # no checkpoint yet, and the wait has not run out
    folder = Path(job_artifacts_location(job=job)) / "checkpoints" / "step-41"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x")
    assert job_stop_progress(job=job) is True
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED and job.end_reason == EndReason.BUDGET and job.finished_at
    stopped = JobEvent.objects.get(job=job, kind="job_stopped")
    assert stopped.data["checkpoint"] == 41 and stopped.data["checkpoint_written"] is True


def test_a_stop_whose_checkpoint_never_completes_ends_after_the_wait(settings, tmp_path):
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    job = _training(make_team(), budget_usd=Decimal("10.00"))
    _billed(job)
    job_limits_review(job=job)
    job.refresh_from_db()
    assert job_stop_progress(job=job, now=job.stop_requested_at + timedelta(seconds=61)) is True
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED and "no checkpoint completed" in job.status_message
    assert "starts from step 0" in job.status_message


def test_a_job_not_training_stops_at_once_and_the_team_month_counts(settings):
    team = make_team()
    job = make_job(team, budget_usd=Decimal("100"))  # pending: nothing to checkpoint
    _billed(make_job(team), price="10")  # another job of the team spent $10 this month
    TeamQuota.objects.create(team=team, monthly_budget_usd=Decimal("10.05"))
    assert job_limits_review(job=job) == EndReason.BUDGET
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED and job.end_reason == EndReason.BUDGET
    assert JobEvent.objects.get(job=job, kind="job_stopped").data["budget_of"] == "team_month"


def test_max_runtime_counts_from_the_first_generation_and_max_wait_from_the_first_wait():
    team = make_team()
    job = _training(team, max_runtime_s=7200)
    assert job_limits_review(job=job) is None
    job = _training(team, max_runtime_s=600)
    assert job_limits_review(job=job) == EndReason.MAX_RUNTIME
    waiting = make_job(team, status="provisioning", max_wait_s=60)
    JobEvent.objects.create(job=waiting, kind="capacity_wait", message="no capacity", data={},
                            at=timezone.now() - timedelta(seconds=90))
    assert job_limits_review(job=waiting) == EndReason.MAX_WAIT
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.STOPPED and waiting.end_reason == EndReason.MAX_WAIT


def test_crashes_beyond_max_restarts_fail_the_job_as_a_user_error_preemptions_never_count():
    job = make_job(make_team(), status="running", max_restarts_on_errors=1)
    node = make_instance(job.team, job=job, state="running")

    def crash(code: int) -> bool:
        JobEvent.objects.create(job=job, kind="agent_worker_exit", message="exit", at=timezone.now(),
                                data={"instance": node.pk, "code": code})
        return worker_exit_report(instance=node, code=code, reason="", generation=1,
                                  log_tail=["Traceback (most recent call last):", "ValueError: bad batch"])

    assert crash(0) is False and crash(3) is False  # a clean exit and a fenced node are not crashes
    assert crash(1) is False  # the first crash is restarted
    assert crash(1) is True
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.end_reason == EndReason.USER_ERROR and job.exit_code == 1
    assert job.end_log.endswith("ValueError: bad batch")


def _api(team, role=Role.ADMIN):
    return token_client(make_api_token(team, user=make_api_user(team, role=role)))


def test_resume_takes_a_new_total_budget_and_refuses_bad_ones(settings, tmp_path):
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    team = make_team()
    job = _training(team, budget_usd=Decimal("10.00"))
    _billed(job)
    job_limits_review(job=job)
    job.refresh_from_db()
    job_stop_progress(job=job, now=job.stop_requested_at + timedelta(seconds=61))
    api = _api(team)
    url = f"/api/v1/jobs/{job.pk}/resume/"
    for body, code, field in (({}, 409, "budget_usd"), ({"budget_usd": "0"}, 400, "budget_usd"),
                              ({"budget_usd": "-3"}, 400, "budget_usd"), ({"budget_usd": "5.00"}, 409, "budget_usd"),
                              ({"budget_usd": "nan"}, 400, "budget_usd")):
        answer = api.post(url, body, format="json")
        assert answer.status_code == code, (body, answer.content)
        assert field in answer.content.decode()
        stored = TrainingJob.objects.get(pk=job.pk)
        assert stored.status == JobStatus.STOPPED and stored.budget_usd == Decimal("10.00")
    answer = api.post(url, {"budget_usd": "25.00"}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["status"] == "pending" and body["budget_usd"] == "25.00" and body["end_reason"] == ""
    assert body["resumed_from"] == {"step": 0, "checkpoint": False, "message": body["resumed_from"]["message"]}
    assert Decimal(body["spend"]["spent_usd"]) >= Decimal("9.99")


def test_a_team_queue_admits_by_priority_then_arrival_and_cancels_at_once():
    team = make_team()
    TeamQuota.objects.create(team=team, max_jobs=1)
    first = make_job(team)
    assert first.status == JobStatus.PENDING
    second = make_job(team)
    assert second.status == JobStatus.QUEUED and "max_jobs is 1" in second.status_message
    urgent = make_job(team, priority=500)
    third = make_job(team)
    assert queue_positions(team_id=team.pk) == {urgent.pk: 1, second.pk: 2, third.pk: 3}
    assert queue_admit(team_id=team.pk) == []  # no room yet
    job_cancel(job=third)
    assert TrainingJob.objects.get(pk=third.pk).status == JobStatus.CANCELLED
    job_set_status(TrainingJob.objects.get(pk=first.pk), JobStatus.FINISHED, "done")
    assert queue_admit(team_id=team.pk) == [urgent.pk]
    assert TrainingJob.objects.get(pk=urgent.pk).status == JobStatus.PENDING
    assert JobEvent.objects.filter(job=urgent, kind="admitted").exists()
    answer = _api(team).get(f"/api/v1/jobs/{second.pk}/")
    assert answer.json()["queue_position"] == 1 and answer.json()["status"] == "queued"


def test_a_quota_is_set_by_admins_and_bad_or_too_low_limits_store_nothing():
    team = make_team()
    make_job(team, plan={"dp": 2, "pp": 2, "provider": "local"})  # claims 4 nodes
    admin, member = _api(team), _api(team, role=Role.MEMBER)
    url = f"/api/v1/teams/{team.pk}/quota/"
    assert member.get(url).status_code == 403
    assert admin.patch(url, {"max_jobs": 3}, format="json").status_code == 200
    for body, code, field in (({"max_nodes": -1}, 400, "max_nodes"), ({"monthly_budget_usd": "0"}, 400,
                               "monthly_budget_usd"), ({"max_nodes": 3}, 409, "max_nodes"),
                              ({"max_jobs": 0}, 409, "max_jobs"), ({"max_jobs": "many"}, 400, "max_jobs")):
        answer = admin.patch(url, body, format="json")
        assert answer.status_code == code, (body, answer.content)
        assert field in answer.content.decode()
    quota = TeamQuota.objects.get(team=team)
    assert (quota.max_jobs, quota.max_nodes, quota.monthly_budget_usd) == (3, None, None)
    answer = admin.put(url, {"max_nodes": 4, "monthly_budget_usd": "100.00"}, format="json")
    assert answer.status_code == 200, answer.content
    view = answer.json()
    assert (view["max_jobs"], view["max_nodes"], view["monthly_budget_usd"]) == (3, 4, "100.00")
    assert view["nodes_claimed"] == 4 and view["jobs_admitted"] == 1
    queued = make_job(team)
    assert admin.get(url).json()["queue"] == [{"job": queued.pk, "position": 1, "reason": queued.status_message}]
    assert admin.patch(url, {"max_nodes": 5}, format="json").json()["queue"] == []  # raising it admits
    assert TrainingJob.objects.get(pk=queued.pk).status == JobStatus.PENDING


def test_set_quota_sets_and_removes_limits():
    team = make_team()
    out = io.StringIO()
    call_command("set_quota", team.slug, "--max-nodes", "8", "--max-jobs", "2", "--monthly-budget", "50", stdout=out)
    assert '"max_nodes": 8' in out.getvalue()
    call_command("set_quota", str(team.pk), "--max-nodes", "none", stdout=io.StringIO())
    quota = TeamQuota.objects.get(team=team)
    assert (quota.max_nodes, quota.max_jobs, quota.monthly_budget_usd) == (None, 2, Decimal("50.00"))
    with pytest.raises(CommandError, match="greater than 0"):
        call_command("set_quota", team.slug, "--monthly-budget", "-1", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no team"):
        call_command("set_quota", "nobody", stdout=io.StringIO())


def test_a_node_standing_by_past_the_limit_beyond_the_spares_is_released_with_an_alert(worker_free_provider):
    provider = worker_free_provider
    team = make_team()
    alert_endpoint_create(team=team, url="http://127.0.0.1:9/hook", events=["node.standby_released"])
    job = make_job(team, status="running", current_generation=1, plan={"dp": 1, "pp": 2, "nodes": 3,
                                                                        "provider": "local"})
    nodes = [make_instance(team, job=job, state="running", provider="local", provider_instance_id=f"fake-{n}")
             for n in range(4)]
    JobGeneration.objects.create(job=job, number=1, created_at=timezone.now(), layout={}, membership=[
        {"instance": nodes[0].pk, "rank": 0}, {"instance": nodes[1].pk, "rank": 1}])
    now = timezone.now()
    assert standby_review(job=job, now=now) == []  # stamped now
    stamped = dict(Instance.objects.filter(job=job).values_list("pk", "standby_since"))
    assert stamped[nodes[0].pk] is None and stamped[nodes[2].pk] == now and stamped[nodes[3].pk] == now
    assert standby_review(job=job, now=now + timedelta(seconds=200)) == []  # within the limit
    # Past it: one of the two is the plan's spare (3 nodes for dp x pp = 2); the other goes.
    released = standby_review(job=job, now=now + timedelta(seconds=301))
    assert len(released) == 1 and released[0] in (nodes[2].pk, nodes[3].pk)
    assert Instance.objects.get(pk=released[0]).state == "terminated"
    assert provider.terminated == [Instance.objects.get(pk=released[0]).provider_instance_id]
    event = JobEvent.objects.get(job=job, kind="standby_released")
    assert event.data["instance"] == released[0] and event.data["standby_s"] == 301.0
    assert AlertDelivery.objects.filter(endpoint__team=team, event="node.standby_released").count() == 1
    # A generation that takes the spare clears its stamp.
    spare = nodes[2].pk if released[0] == nodes[3].pk else nodes[3].pk
    JobGeneration.objects.create(job=job, number=2, created_at=timezone.now(), layout={}, membership=[
        {"instance": nodes[0].pk, "rank": 0}, {"instance": spare, "rank": 1}])
    TrainingJob.objects.filter(pk=job.pk).update(current_generation=2)
    job.refresh_from_db()
    standby_review(job=job, now=now + timedelta(seconds=400))
    assert Instance.objects.get(pk=spare).standby_since is None


def test_an_explicit_plan_estimated_above_the_budget_is_refused_unless_allowed():
    team = make_team()
    api = _api(team)
    body = {"name": "big", "strategy": "recycle", "target_steps": 2_000_000, "budget_usd": "0.05",
            "config": {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 64, "n_head": 4}, "global_batch": 8},
            "plan": {"dp": 2, "pp": 2, "provider": "local"}}
    answer = api.post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 422, answer.content
    message = answer.json()["detail"] if "detail" in answer.json() else str(answer.json())
    assert "budget_usd" in str(answer.json()) and "$0.05" in message and "estimated at $" in message
    assert not TrainingJob.objects.filter(team=team).exists()
    answer = api.post("/api/v1/jobs/", {**body, "allow_over_budget": True}, format="json")
    assert answer.status_code == 201, answer.content


def test_teams_share_the_account_fairly_borrow_idle_share_and_give_it_back_when_asked(settings):
    settings.SPOTPIPE_ACCOUNT_MAX_VCPUS = 8  # local nodes count 1 vCPU each
    borrower, other = make_team(), make_team()
    plan = {"dp": 2, "pp": 2, "provider": "local"}  # 4 nodes: 4 vCPUs
    first = _training(borrower, plan=plan)
    second = _training(borrower, plan=plan)  # the account is idle: the borrower takes all 8
    assert TrainingJob.objects.get(pk=second.pk).status == JobStatus.RUNNING
    third = make_job(borrower, plan=plan)
    assert third.status == JobStatus.QUEUED and "8 vCPUs are in use" in third.status_message
    assert queue_admit() == []  # beyond its share (4 of 8 with two teams wanting) it waits
    assert TrainingJob.objects.filter(status=JobStatus.STOPPING).count() == 0

    asking = make_job(other, plan=plan)  # within the other team's fair share: the borrower gives back
    assert asking.status == JobStatus.QUEUED
    assert queue_admit() == [] and not TrainingJob.objects.filter(status=JobStatus.STOPPING).exists()  # a quota
    # change admits without reclaiming; the reconcile tick (`reconcile_all`) asks the borrowers to give back
    queue_admit(give_back=give_back_quota)
    stopping = TrainingJob.objects.filter(team=borrower, status=JobStatus.STOPPING)
    assert stopping.count() == 1  # one job frees the 4 vCPUs asked for
    given = stopping.get()
    asked = JobEvent.objects.get(job=given, kind="job_stopping")
    assert asked.data["requeue"] is True and "giving back borrowed quota" in given.status_message
    queue_admit(give_back=give_back_quota)
    assert TrainingJob.objects.filter(status=JobStatus.STOPPING).count() == 1  # asked once, not again
    # Its checkpoint does not come within the wait: it goes back to its queue all the same.
    assert job_stop_progress(job=given, now=given.stop_requested_at + timedelta(seconds=61))
    given.refresh_from_db()
    assert given.status == JobStatus.QUEUED and given.end_reason == "" and given.steps_done == 0
    assert queue_admit() == [asking.pk]
    assert {first.pk, second.pk} - {given.pk} <= set(
        TrainingJob.objects.filter(status=JobStatus.RUNNING).values_list("pk", flat=True))


@pytest.mark.parametrize(("field", "value"), [
    ("priority", -1), ("priority", 1001), ("priority", "high"), ("max_runtime_s", 0), ("max_wait_s", -5),
    ("max_restarts_on_errors", -1), ("max_runtime_s", 2**31), ("priority", True),
])
def test_a_limit_or_priority_out_of_range_is_a_400_naming_it_and_stores_nothing(field, value):
    team = make_team()
    body = {"name": "limits", "strategy": "recycle", "target_steps": 10, "budget_usd": "5.00",
            "config": {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8},
            "plan": {"dp": 1, "pp": 1, "provider": "local"}, field: value}
    answer = _api(team).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"]
    assert not TrainingJob.objects.filter(team=team).exists()


def test_a_move_asked_of_a_job_not_training_changes_nothing_so_the_region_review_moves_it_at_once():
    from controlplane.orchestration.services.job_stop import job_request_stop

    job = make_job(make_team())  # pending: no generation, nothing to checkpoint
    assert job_request_stop(job=job, end_reason="", message="moving", move={"from": "a", "to": "b"}) is False
    job.refresh_from_db()
    assert (job.status, job.stop_requested_at, job.end_reason) == (JobStatus.PENDING, None, "")
    assert not job.events.filter(kind="job_stopping").exists()
