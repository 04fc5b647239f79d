"""POST /api/v1/plans/ and `manage.py plan`: authenticated, team-scoped, 400 naming the field, 422
with the nearest plan when infeasible; prices from the market and risk from recorded notices."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.market.models import SpotPool, SpotPrice
from controlplane.planning.selectors import MIN_EXPOSURE_HOURS, pools_for_plan
from tests.controlplane.api_helpers import make_team_world, token_client
from tests.controlplane.factories import make_instance, make_instance_type, make_job, make_zone

pytestmark = pytest.mark.django_db

URL = "/api/v1/plans/"
MODEL = {"kind": "gpt", "n_layer": 4, "n_embd": 128, "n_head": 4, "seq_len": 64, "vocab_size": 512}


def body(**changes):
    data = {
        "model": dict(MODEL),
        "global_batch": 32,
        "samples": 2_000_000,
        "deadline_hours": 48,
        "instance_types": ["g4dn.xlarge", "g5.xlarge"],
        "max_nodes": 8,
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.fixture
def world():
    return make_team_world()


def test_requires_authentication():
    assert token_client().post(URL, body(), format="json").status_code in (401, 403)


def test_plan_returns_best_alternatives_templates_and_pools(world):
    response = world.member_client.post(URL, body(), format="json")
    assert response.status_code == 200, response.json()
    data = response.json()
    best = data["best"]
    assert best["instance_type"] in ("g4dn.xlarge", "g5.xlarge")
    assert best["hours"] <= 48 and best["feasible"]
    assert best["dp"] * best["pp"] == best["nodes"]
    assert data["considered"] >= 20
    assert data["alternatives"][0]["instance_type"] == best["instance_type"]
    assert [t["nodes"] for t in data["templates"]][-1] == best["nodes"]
    assert {p["instance_type"] for p in data["pools"]} == {"g4dn.xlarge", "g5.xlarge"}
    assert all(p["risk_source"] == "advisor" for p in data["pools"])  # no notices, no stored prices


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"global_batch": 0}, "global_batch"),
        ({"instance_types": []}, "instance_types"),
        ({"instance_types": ["x9.mega"]}, "instance_types"),
        ({"model": {**MODEL, "n_head": 3}}, "model.n_head"),
        ({"model": None}, "model"),
        ({"deadline_hours": -2}, "deadline_hours"),
        ({"global_batch": 30, "microbatch_size": 4}, "microbatch_size"),
        ({"capacity": "cheapest"}, "capacity"),
    ],
)
def test_bad_input_answers_400_naming_the_field(world, changes, field):
    response = world.member_client.post(URL, body(**changes), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()


def test_infeasible_deadline_answers_422_with_the_nearest_plan(world):
    response = world.member_client.post(URL, body(deadline_hours=0.001), format="json")
    assert response.status_code == 422
    data = response.json()
    assert "deadline_hours" in data["errors"]
    assert "cannot be met" in data["detail"]
    assert data["nearest"]["hours"] > 0.001


def test_plan_an_own_job_and_another_teams_job_is_404(world):
    other = make_team_world()
    job = make_job(world.team, target_steps=2000, budget_usd=Decimal("500"))
    response = world.member_client.post(
        URL, {"job": job.id, "instance_types": ["g4dn.xlarge"], "max_nodes": 4}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["best"]["cost_usd"] <= 500
    response = world.member_client.post(URL, {"job": other.job.id, "instance_types": ["g4dn.xlarge"]}, format="json")
    assert response.status_code == 404


def test_prices_come_from_the_market(world):
    itype = make_instance_type("g4dn.xlarge", on_demand="0.526")
    zone = make_zone("us-east-1b", "use1-az6")
    now = timezone.now()
    SpotPrice.objects.create(
        instance_type=itype, zone=zone, price=Decimal("0.1234"), timestamp=now - timedelta(hours=1)
    )
    SpotPool.objects.create(
        instance_type=itype, zone=zone, latest_timestamp=now - timedelta(hours=1), latest_price=Decimal("0.1234")
    )
    response = world.member_client.post(URL, body(instance_types=["g4dn.xlarge"]), format="json")
    assert response.status_code == 200
    pools = response.json()["pools"]
    assert pools == [
        {
            "instance_type": "g4dn.xlarge",
            "zone": "us-east-1b",
            "spot_usd_per_hour": pytest.approx(0.1234),
            "preemptions_per_node_hour": pools[0]["preemptions_per_node_hour"],
            "risk_source": "advisor",
        }
    ]
    assert response.json()["best"]["spot_usd_per_hour"] == pytest.approx(0.1234)


def test_risk_comes_from_our_notices_scoped_to_the_team(world):
    other = make_team_world()
    itype = make_instance_type("g5.xlarge", on_demand="1.006")
    now = timezone.now()
    # 12 instances x 10 h = 120 instance-hours in the pool, 6 of them preempted: 0.05 per node-hour.
    for k in range(12):
        inst = make_instance(other.team, instance_type=itype)
        Instance.objects.filter(pk=inst.pk).update(
            running_at=now - timedelta(hours=10), ended_at=now, state="preempted" if k < 6 else "terminated"
        )
    assert MIN_EXPOSURE_HOURS <= 12 * 10
    mine = pools_for_plan(instance_types=["g5.xlarge"], zones=None, at=now, team_ids=[world.team.id], max_nodes=4)
    theirs = pools_for_plan(instance_types=["g5.xlarge"], zones=None, at=now, team_ids=[other.team.id], max_nodes=4)
    assert mine[0].risk_source == "advisor"
    assert theirs[0].risk_source == "notices"
    assert theirs[0].preemptions_per_node_hour == pytest.approx(6 / 120)


def test_manage_py_plan_prints_the_plan_and_explains_infeasible(capsys):
    args = [
        "--n-layer",
        "4",
        "--n-embd",
        "128",
        "--n-head",
        "4",
        "--seq-len",
        "64",
        "--vocab-size",
        "512",
        "--global-batch",
        "32",
        "--samples",
        "2000000",
        "--instance-type",
        "g4dn.xlarge",
        "--max-nodes",
        "8",
    ]
    call_command("plan", *args, "--deadline-hours", "48")
    out = capsys.readouterr().out
    assert "best (cheapest plan that meets the deadline" in out
    assert "g4dn.xlarge" in out and "templates" in out
    with pytest.raises(CommandError, match=r"(?s)infeasible \(budget_usd\).*nearest feasible plan"):
        call_command("plan", *args, "--budget-usd", "0.01")


@pytest.mark.parametrize("capacity", ["spot", "spot_then_on_demand", "on_demand"])
def test_the_answer_estimates_the_best_plan_for_a_capacity_policy(world, capacity):
    from runtime.planner.catalog import instance_types

    data = world.member_client.post(URL, body(capacity=capacity), format="json").json()
    best, estimate = data["best"], data["estimate"]
    assert estimate["capacity"] == capacity
    assert (estimate["instance_type"], estimate["nodes"], estimate["cost_usd"]) == (
        best["instance_type"], best["nodes"], best["cost_usd"])
    price = instance_types()[best["instance_type"]].on_demand_usd_per_hour
    assert estimate["on_demand_usd_per_hour"] == price
    assert estimate["on_demand_cost_usd"] == pytest.approx(best["hours"] * best["goodput_fraction"]
                                                           * best["nodes"] * price)


def test_a_jobs_plan_is_estimated_for_its_own_policy(world):
    job = make_job(world.team, target_steps=2000, budget_usd=Decimal("500"), capacity="on_demand")
    response = world.member_client.post(URL, {"job": job.id, "instance_types": ["g4dn.xlarge"], "max_nodes": 4},
                                        format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["estimate"]["capacity"] == "on_demand"
