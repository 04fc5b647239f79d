"""`plan: auto` for a model function sent without its per-layer measures (issue 40, item 7): the job
is stored with a one-node plan waiting for a profile; its first node is told to profile the model
(`profile` command), reports what it measured (`POST /api/v1/agents/profile/`), and the job is then
planned from it under the limits it was submitted with. A report that is not a profile is a 400
naming the field and changes nothing; a second report is a 409; a profile that no plan can meet, or
a model the node could not profile, fails the job with the reason. The node's own side (the agent
running `runtime.train.node_profile` on a real model) is tests/orchestration/test_node_profile.py."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobEvent, JobGeneration, JobStatus, TrainingJob
from controlplane.orchestration.services import job_grow
from runtime.config import JobConfig
from spotpipe.commands import describe_plan
from tests.controlplane.api_helpers import make_api_token, make_team_world, token_client
from tests.controlplane.factories import make_instance

pytestmark = pytest.mark.django_db

MEASURES = [{"parameters": 4096 + 64, "forward_flops": 8192.0 * 64, "activation_bytes": 256.0 * 4,
             "output_bytes": 256.0, "kernels": 3, "input_grad": i > 0} for i in range(4)]
PROFILE = {"layers": 4, "layer_measures": MEASURES, "layer_costs": [0.002] * 4, "declared": {}}


@pytest.fixture
def pending(tmp_path: Path, monkeypatch):
    """A job submitted with plan.auto and a model function the control plane has no measures of
    (not even its layer count), and an agent of an instance serving it."""
    marker = tmp_path / "imported"
    (tmp_path / "h40_profiled_model.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\ndef net():\n    raise SystemExit('ran user code')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    world = make_team_world()
    payload = {"name": "profiled", "strategy": "recycle", "target_steps": 20,
               "config": {"model": {"kind": "py", "path": "h40_profiled_model:net"}},
               "deadline": (timezone.now() + timedelta(hours=1)).isoformat(), "plan": {"auto": True}}
    response = world.member_client.post("/api/v1/jobs/", payload, format="json")
    assert response.status_code == 201, response.content
    assert "h40_profiled_model" not in sys.modules and not marker.exists()  # never imported here
    job = TrainingJob.objects.get(pk=response.json()["id"])
    instance = make_instance(world.team, job=job, state="running")
    agent = token_client(make_api_token(world.team, instance=instance))
    return world, job, instance, agent


def test_the_job_waits_with_one_node_and_its_first_node_is_told_to_profile(pending):
    _world, job, _instance, agent = pending
    plan = job.plan
    assert (plan["profile"], plan["nodes"], plan["chosen_by"]) == ("pending", 1, "planner")
    assert (job.config["dp"], job.config["pp"]) == (1, 1)
    assert job_grow(job=job) is None and not JobGeneration.objects.filter(job=job).exists()  # no generation yet
    assert "waiting for the first node" in describe_plan(plan)  # what `spotpipe status` says
    command = agent.get("/api/v1/agents/commands/", {"version": "", "wait": 0}).json()
    assert command["action"] == "profile" and command["job"]["config"]["model"]["path"] == "h40_profiled_model:net"


def test_the_job_is_planned_from_its_first_nodes_profile(pending):
    _world, job, instance, agent = pending
    answer = agent.post("/api/v1/agents/profile/", PROFILE, format="json")
    assert answer.status_code == 202, answer.content
    job.refresh_from_db()
    assert job.plan["profile"] == "" and job.plan["chosen_by"] == "planner" and job.plan["predicted"]["hours"] > 0
    stored = JobConfig.from_dict(job.config)
    assert stored.model.layers == 4 and len(stored.model.layer_measures) == 4
    assert "dp" not in job.plan and len(stored.layer_costs) == 4  # the layout's one home is the contract
    planned = JobEvent.objects.get(job=job, kind="planned")
    assert f"instance {instance.pk}'s profile" in planned.message and "4 layers" in planned.message
    # Planned once: a second report (an agent that restarted) changes nothing.
    again = agent.post("/api/v1/agents/profile/", PROFILE, format="json")
    assert again.status_code == 409 and "does not wait for a profile" in str(again.json())
    assert agent.get("/api/v1/agents/commands/", {"version": "", "wait": 0}).json()["action"] != "profile"


@pytest.mark.parametrize("profile,field", [
    ({**PROFILE, "layer_measures": [{**MEASURES[0], "forward_flops": -1.0}, *MEASURES[1:]]},
     "profile.layer_measures[0].forward_flops"),
    ({**PROFILE, "layers": 3}, "profile.layer_measures"),
    ({**PROFILE, "declared": {"width": 3}}, "profile.declared"),
    ({**PROFILE, "layers": "four"}, "layers"),
    ({**PROFILE, "layer_measures": "all"}, "layer_measures"),
    # Hostile values: a NUL (PostgreSQL refuses it in JSON) and deep nesting, refused before any write.
    ({**PROFILE, "declared": {"seq_len": "\u0000"}}, "declared.seq_len"),
    ({**PROFILE, "layer_measures": [{**MEASURES[0], "kernels": {"a": {"b": {"c": [[[1]]]}}}}, *MEASURES[1:]]},
     "profile.layer_measures[0].kernels"),
])
def test_a_report_that_is_not_a_profile_is_a_400_naming_the_field_and_changes_nothing(pending, profile, field):
    _world, job, _instance, agent = pending
    before = (job.plan, job.config)
    answer = agent.post("/api/v1/agents/profile/", profile, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"], answer.json()
    job.refresh_from_db()
    assert (job.plan, job.config) == before and job.status != JobStatus.FAILED


def test_a_profile_no_plan_can_meet_fails_the_job_with_the_planners_reason(pending):
    _world, job, _instance, agent = pending
    TrainingJob.objects.filter(pk=job.pk).update(target_steps=10**7, deadline=timezone.now() + timedelta(seconds=5))
    answer = agent.post("/api/v1/agents/profile/", PROFILE, format="json")
    assert answer.status_code == 202, answer.content
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.end_reason == "config_error"
    failed = JobEvent.objects.filter(job=job, message__contains="first node's profile").first()
    assert failed is not None and "fastest plan" in failed.message, list(JobEvent.objects.filter(job=job).values_list(
        "kind", "message"))


def test_a_model_the_first_node_could_not_profile_fails_the_job(pending):
    _world, job, _instance, agent = pending
    answer = agent.post("/api/v1/agents/events/", {"kind": "profile_failed",
                                                   "message": "model function h40_profiled_model:net raised"},
                        format="json")
    assert answer.status_code == 202, answer.content
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.end_reason == "config_error"
    assert JobEvent.objects.filter(job=job, message__contains="could not be profiled on the first node").exists()


def test_only_agents_send_profiles(pending):
    world, _job, _instance, _agent = pending
    assert world.member_client.post("/api/v1/agents/profile/", PROFILE, format="json").status_code == 403
