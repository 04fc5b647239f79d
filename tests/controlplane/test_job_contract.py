"""The job contract through the API: the runtime's JobConfig built and validated at submit, the
plan chosen (explicit or by the planner for the deadline) and stored, and the 400s that name the
field for a job the runtime could not run. None of the refused requests writes anything."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobEvent, TrainingJob
from runtime.config import JobConfig
from runtime.strategies.links import link_costs
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 32, "op_timeout_s": 2.0,
          "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}}


@pytest.fixture
def world():
    return make_team_world()


def _submit(world, **body):
    payload = {"name": "contract", "strategy": "recycle", "target_steps": 60, "config": CONFIG, **body}
    payload.setdefault("deadline", (timezone.now() + timedelta(hours=1)).isoformat())
    return world.member_client.post("/api/v1/jobs/", payload, format="json")


def test_explicit_plan_is_stored_and_the_config_is_the_runtimes(world):
    response = _submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4})
    assert response.status_code == 201, response.content
    body = response.json()
    job = TrainingJob.objects.get(pk=body["id"])
    config = JobConfig.from_dict(job.config)  # what the agent hands to the runtime, unchanged
    config.validate()
    assert (config.dp, config.pp, config.microbatches, config.strategy, config.steps) == (2, 2, 4, "recycle", 60)
    assert job.plan["chosen_by"] == "user" and job.plan["nodes"] == 4 and job.plan["provider"] == "local"
    assert body["config"] == job.config
    # The layout is stored once, in the contract; the API's plan shows it beside where the nodes come from.
    assert not {"dp", "pp", "microbatches", "strategy", "min_stages"} & set(job.plan)
    assert body["plan"] == {**job.plan, "dp": 2, "pp": 2, "microbatches": 4, "strategy": "recycle",
                            "schedule": config.schedule, "min_stages": config.min_stages}
    # The old clients' view of the contract is still served.
    assert body["model_spec"]["layers"] == 2 and body["model_spec"]["micro_batches"] == 8


def test_the_link_bandwidth_a_job_states_reaches_the_runtime(world):
    # recycle's spill prices a new host's stage all-reduce at this bandwidth (runtime.strategies.links).
    stated = _submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4}, config={**CONFIG, "link_gbps": 25.0})
    assert stated.status_code == 201, stated.content
    assert JobConfig.from_dict(TrainingJob.objects.get(pk=stated.json()["id"]).config).link_gbps == 25.0
    default = _submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4}).json()
    assert JobConfig.from_dict(TrainingJob.objects.get(pk=default["id"]).config).link_gbps == JobConfig().link_gbps


def test_the_joiner_batching_bound_a_job_states_reaches_the_runtime(world):
    # checkpoint-restart and oobleck regroup for joiners at most this long after the first waits
    # (runtime.distributed.membership.joiners_worth_a_regroup).
    stated = _submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4}, config={**CONFIG, "join_batch_wait_s": 120.0})
    assert stated.status_code == 201, stated.content
    assert JobConfig.from_dict(TrainingJob.objects.get(pk=stated.json()["id"]).config).join_batch_wait_s == 120.0


def test_the_device_a_job_states_reaches_the_runtime(world):
    # cuda: every node on one GPU of its own VM (the agent's --gpu-index); a device the runtime does
    # not know is a 400 naming config.device (JobConfig.problems), and nothing is written.
    stated = _submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4}, config={**CONFIG, "device": "cuda"})
    assert stated.status_code == 201, stated.content
    assert stated.json()["config"]["device"] == "cuda"
    assert JobConfig.from_dict(TrainingJob.objects.get(pk=stated.json()["id"]).config).device == "cuda"
    default = _submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4}).json()
    assert JobConfig.from_dict(TrainingJob.objects.get(pk=default["id"]).config).device == JobConfig().device == "cpu"
    before = TrainingJob.objects.count()
    refused = _submit(world, plan={"dp": 1, "pp": 1}, config={**CONFIG, "device": "tpu"})
    assert refused.status_code == 400, refused.content
    assert "'tpu' is unknown" in " ".join(refused.json()["errors"]["config.device"])
    assert TrainingJob.objects.count() == before


def test_auto_plan_meets_the_deadline_with_more_nodes_when_one_cannot(world):
    relaxed = _submit(world, plan="auto").json()
    one_node = relaxed["plan"]
    assert one_node["chosen_by"] == "planner" and one_node["dp"] * one_node["pp"] == 1  # cheapest in an hour
    hours = one_node["predicted"]["hours"]
    tight = _submit(world, plan={"auto": True, "max_nodes": 4},
                    deadline=(timezone.now() + timedelta(hours=hours * 0.6)).isoformat())
    assert tight.status_code == 201, tight.content
    plan = tight.json()["plan"]
    assert plan["dp"] * plan["pp"] > 1 and plan["nodes"] == plan["dp"] * plan["pp"]
    assert plan["predicted"]["hours"] < hours * 0.6
    assert plan["predicted"]["cost_usd"] > 0  # local nodes are priced as the type they stand in for
    assert plan["runner_ups"], "the runner-up plans are stored for the job page"
    config = TrainingJob.objects.get(pk=tight.json()["id"]).config
    assert (config["dp"], config["pp"], config["microbatches"]) == (plan["dp"], plan["pp"], plan["microbatches"])
    # It states what the plan was priced with (runtime.strategies.links.stated_by_cost_models): the
    # local node's per-layer seconds (its emulated device time) and bandwidth, so spill prices links.
    stated = JobConfig.from_dict(config)
    layer_s = sum(CONFIG["device_time"].values()) / 1000
    assert stated.layer_costs == pytest.approx([layer_s] * stated.model.num_layers)
    assert stated.link_gbps > 0 and link_costs(stated) is not None


def test_a_deadline_no_plan_meets_names_the_deadline_and_the_fastest_plan(world):
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    response = _submit(world, plan={"auto": True, "max_nodes": 2},
                       deadline=(timezone.now() + timedelta(seconds=1)).isoformat())
    assert response.status_code == 400, response.content
    message = response.json()["errors"]["deadline"][0]
    assert "the fastest plan" in message and "dp=2" in message and "predicted to take" in message
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"plan": {"dp": 1, "pp": 5}}, "plan.pp"),  # the model has 4 layers
        ({"plan": {"dp": 3, "pp": 1}}, "config.global_batch"),  # 32 is not divisible by 3 x 4
        ({"plan": {"dp": 1, "pp": 1, "instance_types": ["p9.mega"]}}, "plan.instance_types"),
        ({"plan": {"dp": 1, "pp": 1, "provider": "gcp"}}, "plan.provider"),
        ({"plan": {"dp": 0}}, "plan.dp"),
        ({"plan": {"dp": "2"}}, "plan.dp"),
        ({"plan": {"auto": True, "dp": 2}}, "plan.dp"),
        ({"plan": {"zones": ["a\x00b"]}}, "plan.zones[0]"),  # refused as it is parsed
        ({"plan": {"nodes": 1, "dp": 2}}, "plan.nodes"),
        ({"plan": {"flavour": 1}}, "plan.flavour"),
        ({"plan": {"dp": 1, "replan": True}}, "plan.replan"),  # only the planner's plans are re-planned
        ({"plan": [1]}, "plan"),
        ({"config": {**CONFIG, "model": {"kind": "gpt", "n_embd": 30, "n_head": 4}}}, "config.model.n_head"),
        ({"config": {**CONFIG, "lr": "fast"}}, "config.lr"),
        ({"config": {**CONFIG, "dp": 2}}, "config.dp"),
        ({"config": {**CONFIG, "checkpoint_dir": "x" * 2000}}, "config.checkpoint_dir"),
        ({"config": {**CONFIG, "wings": 2}}, "config.wings"),
        ({"config": {**CONFIG, "schedule": "zigzag"}}, "config.schedule"),
        ({"config": {**CONFIG, "precision": "fp8"}}, "config.precision"),
        ({"config": {**CONFIG, "device": "tpu"}}, "config.device"),
        ({"config": {**CONFIG, "device": ["cuda"]}}, "config.device"),
        ({"config": {**CONFIG, "loss_scale_init": 1000}}, "config.loss_scale_init"),
        ({"config": {**CONFIG, "loss_scale_init": "big"}}, "config.loss_scale_init"),
        ({"config": {**CONFIG, "loss_scale_growth_interval": 0}}, "config.loss_scale_growth_interval"),
        ({"config": {**CONFIG, "link_gbps": -1}}, "config.link_gbps"),
        ({"config": {**CONFIG, "join_batch_wait_s": -5}}, "config.join_batch_wait_s"),
        ({"config": {**CONFIG, "export": "onnx"}}, "config.export"),
        ({"config": {**CONFIG, "export": "hf"}}, "config.export"),  # a Hugging Face GPT-2 folder needs a gpt
        ({"config": None, "model_spec": {"kind": "gpt", "layers": 2, "heads": 3, "d_model": 32}},
         "model_spec.heads"),
    ],
)
def test_a_job_the_runtime_cannot_run_is_refused_naming_the_field(world, body, field):
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    payload = {k: v for k, v in body.items() if v is not None}
    if body.get("config", "") is None:
        response = world.member_client.post("/api/v1/jobs/", {
            "name": "contract", "strategy": "recycle", "target_steps": 60, "budget_usd": "5", **payload},
            format="json")
    else:
        response = _submit(world, **payload)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


def test_every_problem_of_a_contract_is_reported_at_once(world):
    # Values of the wrong type are all reported together, before any value is judged...
    response = _submit(world, config={**CONFIG, "lr": "x", "seed": 1.5, "model": {"n_layer": "2"}})
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"config.lr", "config.seed", "config.model.n_layer"}
    # ...and so are values the runtime cannot run.
    bad = {**CONFIG, "model": {"kind": "gpt", "n_embd": 30, "n_head": 4, "n_layer": 0}, "schedule": "zigzag"}
    response = _submit(world, config=bad, plan={"dp": 1, "pp": 1})
    assert response.status_code == 400
    assert {"config.model.n_head", "config.model.n_layer", "config.schedule"} <= set(response.json()["errors"])


def test_every_layout_field_of_the_runtime_has_a_request_field():
    from controlplane.jobs.services import LAYOUT_REQUEST_FIELDS
    from runtime.config import LAYOUT_FIELDS

    assert set(LAYOUT_REQUEST_FIELDS) == set(LAYOUT_FIELDS)


@pytest.mark.parametrize(
    "config",
    ['{"a":' * 5000 + "1" + "}" * 5000, '{"model": {"kind": "mlp"}, "checkpoint_dir": "a\\u0000b"}',
     '{"model": {"kind\\u0000": "mlp"}}', '{"model": {"kind": "mlp"}, "checkpoint_dir": "a\\ud800b"}',
     '{"model": {"kind": "mlp", "args\\udfff": 1}}', '{"a":' * 100 + "1" + "}" * 100],
    ids=["nested-5000-deep", "nul-in-a-string", "nul-in-a-key", "surrogate-in-a-string", "surrogate-in-a-key",
         "nested-100-deep"],
)
def test_hostile_json_gets_a_400_and_writes_nothing(world, config):
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    body = '{"name": "x", "strategy": "recycle", "target_steps": 5, "budget_usd": "5", "config": ' + config + "}"
    response = world.member_client.post("/api/v1/jobs/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert any(words in response.json()["detail"] for words in ("nested", "NUL", "lone surrogate")), response.json()
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


@pytest.mark.parametrize(("path", "body"), [
    ("/api/v1/tokens/", {"name": "t", "kind": "\ud800"}),
    ("/api/v1/jobs/", {"name": "x", "strategy": "\ud800", "target_steps": 5, "budget_usd": "5",
                       "config": {"model": {"kind": "mlp"}}}),
    ("/api/v1/jobs/", {"name": "x", "strategy": "recycle", "target_steps": 5, "budget_usd": "5",
                       "config": {"model": {"kind": "mlp"}, "unknown\ud800": 1}}),
])
def test_a_lone_surrogate_echoed_in_an_error_is_a_400_not_a_500(world, path, body):
    """The 400 that names a bad choice or an unknown key echoes it: a lone surrogate there made the
    answer itself unrenderable (a 500). The parser refuses it first, naming where."""
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    response = world.admin_client.post(path, json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert "lone surrogate" in response.json()["detail"]
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


def test_plans_stored_with_a_layout_copy_lose_it_and_still_read(world):
    """Plans stored before the layout had one home carried dp, pp, ... too: the migration drops
    them (the contract held the same values) and `JobPlan.from_dict` reads either shape."""
    import importlib

    from django.apps import apps

    from controlplane.planning.plans import JobPlan

    job = TrainingJob.objects.get(pk=_submit(world, plan={"dp": 2, "pp": 2, "microbatches": 4}).json()["id"])
    old = {**job.plan, "dp": 2, "pp": 2, "microbatches": 4, "strategy": "recycle", "min_stages": 1}
    TrainingJob.objects.filter(pk=job.pk).update(plan=old)
    assert JobPlan.from_dict(old) == JobPlan.from_dict(job.plan)
    migration = importlib.import_module("controlplane.jobs.migrations.0011_plan_without_layout")
    migration.drop_layout_from_plans(apps, None)
    job.refresh_from_db()
    assert job.plan == {k: v for k, v in old.items() if k not in ("dp", "pp", "microbatches", "strategy",
                                                                  "min_stages")}
