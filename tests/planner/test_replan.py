"""Re-planning as prices move (jobs.replanning.job_replan, run by beat for jobs submitted with
plan.auto and plan.replan): before the job starts the whole plan may change; once it runs only the
pools move, its dp x pp grid stays; a move smaller than REPLAN_GAIN, or a job that did not ask, stays."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobEvent, TrainingJob
from controlplane.jobs.replanning import job_replan, replan_due_jobs
from controlplane.jobs.services import job_submit
from controlplane.market.models import SpotPool, SpotPrice
from tests.controlplane.factories import make_instance_type, make_team, make_zone

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 256, "n_head": 4, "seq_len": 128, "vocab_size": 1024},
          "global_batch": 32}


def _price(itype, zone, price: str, at) -> None:
    SpotPrice.objects.create(instance_type=itype, zone=zone, price=Decimal(price), timestamp=at)
    SpotPool.objects.update_or_create(instance_type=itype, zone=zone, defaults={
        "latest_timestamp": at, "latest_price": Decimal(price)})


@pytest.fixture
def market():
    now = timezone.now()
    itype = make_instance_type("g5.xlarge", on_demand="1.006")
    a, b = make_zone("us-east-1a", "use1-az1"), make_zone("us-east-1b", "use1-az2")
    _price(itype, a, "0.30", now - timedelta(hours=2))
    _price(itype, b, "0.40", now - timedelta(hours=2))
    return itype, a, b


def _submit(replan: bool = True) -> TrainingJob:
    return job_submit(
        team=make_team(), user=None, name="replan", strategy="recycle", target_steps=20_000, config=CONFIG,
        deadline=timezone.now() + timedelta(hours=12),
        plan={"auto": True, "provider": "aws", "instance_types": ["g5.xlarge"], "max_nodes": 8, "replan": replan})


def test_a_cheaper_pool_takes_the_plan_over_before_the_start(market):
    itype, a, _b = market
    job = _submit()
    assert job.plan["pools"] == [{"instance_type": "g5.xlarge", "zone": "us-east-1a", "region": "us-east-1"}]
    assert job_replan(job=job) is None  # nothing moved
    _price(itype, a, "0.90", timezone.now() - timedelta(minutes=1))  # zone a is now dearer than b
    plan = job_replan(job=job)
    assert plan is not None and plan.pools[0].zone == "us-east-1b"
    job.refresh_from_db()
    assert job.plan["pools"] == [{"instance_type": "g5.xlarge", "zone": "us-east-1b", "region": "us-east-1"}]
    assert job.config["steps"] == job.target_steps and "dp" not in job.plan  # the layout's one home: config
    event = JobEvent.objects.get(job=job, kind="replanned")
    assert "us-east-1a" in event.message and "us-east-1b" in event.message


def test_a_running_job_keeps_its_grid_and_moves_its_pools(market):
    itype, a, _b = market
    job = _submit()
    grid = (job.config["dp"], job.config["pp"])
    TrainingJob.objects.filter(pk=job.pk).update(current_generation=1, status="running", steps_done=100)
    _price(itype, a, "0.90", timezone.now() - timedelta(minutes=1))
    plan = job_replan(job=job)
    job.refresh_from_db()
    assert plan is not None and (job.config["dp"], job.config["pp"]) == grid and plan.pools[0].zone == "us-east-1b"
    assert replan_due_jobs() == []  # done: the next round finds nothing to change


def test_small_moves_and_jobs_that_did_not_ask_stay(market):
    itype, a, _b = market
    job, fixed = _submit(), _submit(replan=False)
    _price(itype, a, "0.42", timezone.now() - timedelta(minutes=1))  # b is cheaper, but by under 10%
    assert job_replan(job=job) is None
    _price(itype, a, "0.90", timezone.now() - timedelta(seconds=30))
    assert replan_due_jobs() == [job.pk]  # the one that asked, and only it
    assert job_replan(job=fixed) is None
    assert TrainingJob.objects.get(pk=fixed.pk).plan["pools"][0]["zone"] == "us-east-1a"
