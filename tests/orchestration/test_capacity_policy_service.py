"""The capacity policy at run time: spot_then_on_demand buys on-demand when the deadline needs it
and swaps the job's nodes over one by one; an unreachable deadline is an event and an alert, once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import TrainingJob
from controlplane.orchestration import services
from controlplane.orchestration.models import Acquisition
from controlplane.orchestration.offerings import offerings_mark_no_capacity
from controlplane.orchestration.providers.base import Pool
from controlplane.orchestration.services.capacity_policy import job_capacity_review, work_estimate
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertDelivery
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db

SPOT_POOL = Pool(instance_type="local.node", zone="local")


def _job(*, capacity: str, steps: int = 100, step_s: float = 1.0, deadline_s: float = 3600.0) -> TrainingJob:
    job = make_job(make_team(), strategy="recycle", target_steps=steps, capacity=capacity,
                   deadline=timezone.now() + timedelta(seconds=deadline_s),
                   plan={"dp": 2, "pp": 1, "provider": "local"})
    # The planner's prediction, as `plan: auto` stores it (an explicit plan is judged by its samples).
    TrainingJob.objects.filter(pk=job.pk).update(plan={**job.plan, "predicted": {"step_s": step_s}})
    job.refresh_from_db()
    return job


def _enroll(acquisition: Acquisition) -> list[Instance]:
    key = services.acquisition_enroll_key(acquisition=acquisition)
    instances = list(Instance.objects.filter(request_token__startswith=acquisition.request_token + "/"))
    for instance in instances:
        services.agent_enroll(enroll_key=key, provider_instance_id=instance.provider_instance_id)
    services.job_grow(job=acquisition.job)
    return instances


def test_spot_then_on_demand_waits_for_spot_while_the_deadline_allows(fake):
    offerings_mark_no_capacity(provider="local", pools=[SPOT_POOL], capacity_type="spot", code="InsufficientCapacity")
    job = _job(capacity="spot_then_on_demand", steps=100, step_s=1.0, deadline_s=3600)  # 100 s of work in 1 h

    services.capacity_reconcile(job=job)

    job.refresh_from_db()
    assert job.capacity_type == "spot" and fake.launches == []
    assert job.events.filter(kind="capacity_wait").exists()


def test_spot_then_on_demand_buys_on_demand_when_spot_cannot_meet_the_deadline(fake):
    offerings_mark_no_capacity(provider="local", pools=[SPOT_POOL], capacity_type="spot", code="InsufficientCapacity")
    job = _job(capacity="spot_then_on_demand", steps=100, step_s=10.0, deadline_s=1200)  # 1,000 s of work

    report = services.capacity_reconcile(job=job)

    job.refresh_from_db()
    assert report["capacity"] == "on_demand" and job.capacity_type == "on_demand"
    (switch,) = job.events.filter(kind="capacity_switch")
    assert switch.data["from"] == "spot" and switch.data["to"] == "on_demand" and "to on-demand" in switch.message
    (acquisition,) = Acquisition.objects.filter(job=job)
    assert acquisition.capacity_type == "on_demand"
    assert [r.capacity_type for r in fake.launches] == ["on_demand"]
    assert set(Instance.objects.filter(job=job).values_list("lifecycle", flat=True)) == {"on_demand"}
    assert job.deadline_unreachable_at is None


def test_a_switch_acquires_the_new_type_and_retires_the_old_nodes_one_by_one(fake):
    job = _job(capacity="spot_then_on_demand", steps=100, step_s=10.0, deadline_s=3600)
    first = services.job_start(job=job)
    services.acquisition_launch(acquisition=first)
    _enroll(first)
    TrainingJob.objects.filter(pk=job.pk).update(status="running")  # its workers reported (as agents do)
    job.refresh_from_db()
    assert job.current_generation == 1
    # Spot goes dry and the deadline comes close: the policy buys on-demand in full.
    offerings_mark_no_capacity(provider="local", pools=[SPOT_POOL], capacity_type="spot", code="InsufficientCapacity")
    TrainingJob.objects.filter(pk=job.pk).update(deadline=timezone.now() + timedelta(seconds=1150))
    job.refresh_from_db()
    services.capacity_reconcile(job=job)
    fresh = Acquisition.objects.filter(job=job, capacity_type="on_demand").get()
    on_demand = _enroll(fresh)
    assert len(on_demand) == 2

    retired = []
    for _ in range(4):
        report = services.capacity_reconcile(job=job)
        if report["retired"]:
            retired.append(report["retired"])
    job.refresh_from_db()
    spot = Instance.objects.filter(job=job, lifecycle="spot")
    assert sorted(retired) == sorted(spot.values_list("pk", flat=True))
    assert set(spot.values_list("state", flat=True)) == {InstanceState.TERMINATED}
    assert set(Instance.objects.filter(job=job, lifecycle="on_demand").values_list("state", flat=True)) == {
        InstanceState.RUNNING}
    members = {m["instance"] for m in job.generations.get(number=job.current_generation).membership}
    assert members == {i.pk for i in on_demand}
    assert job.events.filter(kind="instance_terminated", message__contains="capacity switch to on_demand").count() == 2


def test_an_unreachable_deadline_is_an_event_and_an_alert_once(fake):
    job = _job(capacity="spot", steps=100, step_s=60.0, deadline_s=600)  # 6,000 s of work in 600 s
    alert_endpoint_create(team=job.team, url="https://alerts.example.com/hook")

    job_capacity_review(job=job)
    job_capacity_review(job=job)

    job.refresh_from_db()
    assert job.deadline_unreachable_at is not None
    (event,) = job.events.filter(kind="deadline_unreachable")
    assert event.data["step_source"] == "predicted" and event.data["work_left_s"] == 6000.0
    (delivery,) = AlertDelivery.objects.filter(endpoint__team=job.team, event="job.deadline_unreachable")
    assert delivery.payload["data"]["job"] == job.pk


def test_the_estimate_prefers_the_jobs_measured_step_time(fake):
    from controlplane.jobs.models import MetricSample

    job = _job(capacity="spot", steps=100, step_s=1.0)
    assert work_estimate(job=job, now=timezone.now()).source == "predicted"
    batch = job.config["global_batch"]
    MetricSample.objects.bulk_create([MetricSample(job=job, step=s, at=timezone.now(), samples_per_s=batch / 4.0)
                                      for s in range(5)])
    TrainingJob.objects.filter(pk=job.pk).update(steps_done=5)
    job.refresh_from_db()
    estimate = work_estimate(job=job, now=timezone.now())
    assert (estimate.source, estimate.step_s, estimate.work_left_s) == ("measured", 4.0, 380.0)


def test_an_explicit_plan_with_a_deadline_is_judged_before_its_first_samples(fake):
    """An explicit layout of a built-in model stores the planner's estimate of that layout, so its
    deadline is judged from the start rather than after its first metric samples."""
    job = make_job(make_team(), strategy="recycle", target_steps=10_000_000, capacity="spot",
                   deadline=timezone.now() + timedelta(seconds=600), plan={"dp": 2, "pp": 1, "provider": "local"},
                   allow_over_budget=True)
    predicted = job.plan["predicted"]
    assert (predicted["dp"], predicted["pp"]) == (2, 1) and predicted["step_s"] > 0
    estimate = work_estimate(job=job, now=timezone.now())
    assert estimate.source == "predicted" and estimate.step_s == predicted["step_s"]

    job_capacity_review(job=job)

    job.refresh_from_db()
    assert job.deadline_unreachable_at is not None
    (event,) = job.events.filter(kind="deadline_unreachable")
    assert event.data["step_source"] == "predicted"
