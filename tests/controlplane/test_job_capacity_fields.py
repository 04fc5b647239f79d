"""A job's capacity policy, regions and zones through the API: stored when known; an unknown
policy, region or zone is a 400 naming the field and the value, and nothing is stored."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobEvent, TrainingJob
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8}


@pytest.fixture
def world():
    return make_team_world()


def _submit(world, **body):
    payload = {"name": "capacity", "strategy": "recycle", "target_steps": 20, "config": CONFIG,
               "deadline": (timezone.now() + timedelta(hours=1)).isoformat(), **body}
    return world.member_client.post("/api/v1/jobs/", payload, format="json")


@pytest.mark.parametrize(("policy", "bought_as"), [(None, "spot"), ("spot", "spot"),
                                                    ("spot_then_on_demand", "spot"), ("on_demand", "on_demand")])
def test_the_capacity_policy_is_stored_with_what_it_buys_first(world, policy, bought_as):
    body = {"capacity": policy} if policy else {}
    response = _submit(world, plan={"dp": 1, "pp": 1}, **body)
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert (job.capacity, job.capacity_type) == (policy or "spot", bought_as)
    assert response.json()["capacity"] == job.capacity and response.json()["capacity_type"] == bought_as


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"capacity": "cheapest"}, "capacity", "unknown capacity policy 'cheapest'"),
    ({"capacity": "x" * 41}, "capacity", "40"),
    ({"capacity": "spot\x00"}, "capacity", ""),
    ({"capacity": ["spot"]}, "capacity", ""),
    ({"plan": {"regions": ["us-east-1\x00"]}}, "plan.regions[0]", "NUL"),
    ({"plan": {"provider": "aws", "instance_types": ["p3.2xlarge"], "regions": ["mars-north-1"]}},
     "plan.regions", "'mars-north-1' is not a region this control plane launches in"),
    ({"plan": {"provider": "aws", "instance_types": ["p3.2xlarge"], "zones": ["us-east-1z", "atlantis-1a"]}},
     "plan.zones", "'atlantis-1a' is not an AWS zone"),
    ({"plan": {"provider": "aws", "instance_types": ["p3.2xlarge"], "zones": ["us-west-2a"]}},
     "plan.zones", "'us-west-2a' is in us-west-2, not in the job's regions ['us-east-1']"),
    ({"plan": {"provider": "local", "zones": ["local-z"]}}, "plan.zones", "'local-z' is not a local zone"),
    ({"plan": {"provider": "local", "regions": ["us-east-1"]}}, "plan.regions", "not a local region"),
    ({"plan": {"regions": "us-east-1"}}, "plan.regions", "must be a list"),
])
def test_an_unknown_policy_region_or_zone_is_a_400_naming_it_and_nothing_is_stored(world, body, field, words):
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    response = _submit(world, **body)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors and any(words in message for message in errors[field]), errors
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


def test_a_plan_over_several_regions_keeps_each_pools_region(world, monkeypatch):
    monkeypatch.setenv("SPOTPIPE_AWS_REGIONS", "us-east-1,us-west-2")
    response = _submit(world, plan={"provider": "aws", "instance_types": ["p3.2xlarge"],
                                    "regions": ["us-west-2", "us-east-1"]})
    assert response.status_code == 201, response.content
    plan = TrainingJob.objects.get(pk=response.json()["id"]).plan
    assert plan["regions"] == ["us-west-2", "us-east-1"]
    assert [(p["zone"], p["region"]) for p in plan["pools"]] == [("", "us-west-2"), ("", "us-east-1")]
    zoned = _submit(world, plan={"provider": "aws", "instance_types": ["p3.2xlarge"], "zones": ["us-west-2b"]})
    assert zoned.status_code == 201, zoned.content
    assert TrainingJob.objects.get(pk=zoned.json()["id"]).plan["pools"][0]["region"] == "us-west-2"


def test_spotpipe_resume_says_from_which_step(world, monkeypatch):
    """`spotpipe resume JOB` through the API in-process: a cancelled job with no checkpoint resumes
    from step 0 and the command says so."""
    import io

    from spotpipe import commands

    job = TrainingJob.objects.get(pk=_submit(world, plan={"dp": 1, "pp": 1}).json()["id"])
    TrainingJob.objects.filter(pk=job.pk).update(status="cancelled", steps_done=7)

    class Served:  # spotpipe's client, answered by the API in-process
        def resume(self, job_id: int, *, budget_usd: str | None = None) -> dict:
            body = {"budget_usd": budget_usd} if budget_usd else {}
            return world.member_client.post(f"/api/v1/jobs/{job_id}/resume/", body, format="json").json()

    monkeypatch.setattr(commands, "_client", Served)
    out = io.StringIO()
    assert commands.resume(job.pk, budget="40.00", out=out) == 0
    assert out.getvalue().strip() == (f"job {job.pk} pending: resumed by {world.member.username} from step 0: "
                                      "the job has no complete checkpoint")
    stored = TrainingJob.objects.get(pk=job.pk)
    assert stored.steps_done == 0 and stored.budget_usd == Decimal("40.00")  # `--budget`: the new total
