"""The planner's cost estimate follows the job's capacity policy (`planning.services._prediction`):
spot keeps the spot estimate, on_demand prices the same work at the catalogue's on-demand price
(without the preemption overhead spot pays), spot_then_on_demand carries both; the client and the
job page label them as estimates."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from controlplane.jobs.models import TrainingJob
from controlplane.jobs.replanning import job_replan
from controlplane.jobs.services import job_submit
from controlplane.market.models import SpotPool, SpotPrice
from runtime.planner.capacity_policy import CAPACITY_POLICIES
from runtime.planner.catalog import instance_types
from spotpipe.commands import describe_plan
from tests.controlplane.factories import make_instance_type, make_team, make_user, make_zone

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 256, "n_head": 4, "seq_len": 128, "vocab_size": 1024},
          "global_batch": 32}
TYPE = "g5.xlarge"


@pytest.fixture
def market():
    at = timezone.now() - timedelta(hours=1)
    itype, zone = make_instance_type(TYPE, on_demand="1.006"), make_zone("us-east-1a", "use1-az1")
    SpotPrice.objects.create(instance_type=itype, zone=zone, price=Decimal("0.30"), timestamp=at)
    SpotPool.objects.create(instance_type=itype, zone=zone, latest_timestamp=at, latest_price=Decimal("0.30"))
    return itype, zone


def _submit(capacity: str, *, replan: bool = False, team=None) -> TrainingJob:
    return job_submit(
        team=team or make_team(), user=None, name=f"estimate-{capacity}", strategy="recycle", target_steps=20_000,
        config=CONFIG, deadline=timezone.now() + timedelta(hours=12), capacity=capacity,
        plan={"auto": True, "provider": "aws", "instance_types": [TYPE], "max_nodes": 8, "replan": replan})


def test_each_policy_gets_its_estimate_from_the_same_plan(market):
    predicted = {capacity: _submit(capacity).plan["predicted"] for capacity in CAPACITY_POLICIES}
    price = instance_types()[TYPE].on_demand_usd_per_hour
    spot = predicted["spot"]
    for capacity, p in predicted.items():
        assert p["capacity"] == capacity
        # The plan is chosen on spot prices whatever the policy: the same layout and spot figure.
        assert (p["nodes"], p["dp"], p["pp"], p["cost_usd"]) == (spot["nodes"], spot["dp"], spot["pp"],
                                                                 spot["cost_usd"])
        assert p["cost_usd"] == pytest.approx(p["hours"] * p["nodes"] * p["spot_usd_per_hour"])
        # On demand: no preemptions, so the hours without the planner's preemption overhead.
        assert p["on_demand_usd_per_hour"] == price
        assert p["on_demand_hours"] == pytest.approx(p["hours"] * p["goodput_fraction"])
        assert p["on_demand_cost_usd"] == pytest.approx(p["on_demand_hours"] * p["nodes"] * price)
    assert spot["on_demand_cost_usd"] > spot["cost_usd"]  # spot at 0.30/h against 1.006/h on demand


def test_runner_ups_carry_the_policy_too(market):
    job = _submit("on_demand")
    for runner_up in job.plan["runner_ups"]:
        assert runner_up["capacity"] == "on_demand"
        assert runner_up["on_demand_cost_usd"] == pytest.approx(
            runner_up["hours"] * runner_up["goodput_fraction"] * runner_up["nodes"]
            * instance_types()[TYPE].on_demand_usd_per_hour)


def test_a_replan_keeps_the_jobs_policy(market):
    itype, _zone = market
    job = _submit("spot_then_on_demand", replan=True)
    cheaper = make_zone("us-east-1b", "use1-az2")
    at = timezone.now() - timedelta(minutes=1)
    SpotPrice.objects.create(instance_type=itype, zone=cheaper, price=Decimal("0.10"), timestamp=at)
    SpotPool.objects.create(instance_type=itype, zone=cheaper, latest_timestamp=at, latest_price=Decimal("0.10"))
    plan = job_replan(job=job)
    assert plan is not None and plan.pools[0].zone == "us-east-1b"
    assert plan.predicted["capacity"] == "spot_then_on_demand"
    assert plan.predicted["on_demand_cost_usd"] > plan.predicted["cost_usd"]


@pytest.mark.parametrize("capacity, shown, hidden", [
    ("spot", ["on spot (estimate)"], ["on demand"]),
    ("on_demand", ["on demand (estimate)"], ["on spot"]),
    ("spot_then_on_demand", ["on spot", "ceiling", "all on demand (estimates)"], []),
])
def test_the_client_labels_the_policys_figures_as_estimates(market, capacity, shown, hidden):
    plan = _submit(capacity).plan
    line = describe_plan(plan)
    p = plan["predicted"]
    for text in shown:
        assert text in line
    for text in hidden:
        assert text not in line
    if capacity != "on_demand":
        assert f"${p['cost_usd']:.4f} on spot" in line
    if capacity != "spot":
        assert f"${p['on_demand_cost_usd']:.4f}" in line


def test_a_plan_made_before_policies_reads_as_spot():
    old = {"chosen_by": "planner", "nodes": 2, "provider": "aws", "pools": [], "dp": 2, "pp": 1, "microbatches": 4,
           "predicted": {"hours": 1.0, "cost_usd": 1.5, "samples_per_s": 10.0}}
    assert "$1.5000 on spot (estimate)" in describe_plan(old)


@pytest.mark.parametrize("capacity", CAPACITY_POLICIES)
def test_the_job_page_shows_the_policys_estimate(client, market, capacity):
    team = make_team()
    client.force_login(make_user(team))
    job = _submit(capacity, team=team)
    p = job.plan["predicted"]
    page = client.get(reverse("frontend:job-detail", args=[job.pk])).content.decode()
    assert f"Capacity policy <strong>{capacity}</strong>" in page
    spot, on_demand = f"${p['cost_usd']:.2f} on spot", f"${p['on_demand_cost_usd']:.2f} all on demand"
    assert (spot in page) == (capacity != "on_demand")
    assert (on_demand in page) == (capacity != "spot")
