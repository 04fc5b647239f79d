"""Dashboard pages and data endpoints through Django's test client: every page renders, every
endpoint returns its series, a job with no data renders its empty states, another team's job is a
404 everywhere, and the cost report's CSV, JSON and page agree."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from controlplane.accounts.models import Role
from controlplane.jobs.models import JobStatus, TrainingJob
from runtime.config import MODEL_PRESETS
from spotpipe.demo import history as demo_history
from tests.controlplane.factories import make_job, make_team, make_user

pytestmark = pytest.mark.django_db

PAGES = ["overview", "prices", "fleet", "jobs", "notices", "job-new"]
ENDPOINTS = ["overview-data", "prices-data", "fleet-data", "jobs-data", "notices-data"]
JOB_URLS = ["job-detail", "job-cost", "job-data", "job-cost-data", "job-cost-csv", "job-cost-json"]


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """Two teams with the same demo history, and a small price history. Seeded once for the
    module (each test still runs in its own rolled-back transaction) and flushed afterwards."""
    with django_db_blocker.unblock():
        seeded = _seed()
        yield seeded
        call_command("flush", interactive=False, verbosity=0)


def _seed() -> dict:
    now = timezone.now()
    pools = demo_history.ensure_market(pools=4)
    demo_history.load_prices(demo_history.price_rows(pools=pools, start=now - timedelta(days=20), end=now,
                                               changes_per_pool=300))
    team_a, team_b = make_team("alpha"), make_team("beta")
    user_a = make_user(team_a, role=Role.ADMIN, username="alice")
    user_b = make_user(team_b, username="bob")
    jobs_a = demo_history.seed_team_activity(team=team_a, user=user_a, pools=pools, now=now, metric_steps=400)
    jobs_b = demo_history.seed_team_activity(team=team_b, user=user_b, pools=pools, now=now, metric_steps=400,
                                          prefix="b-")
    return {"now": now, "pools": pools, "a": (team_a, user_a, jobs_a), "b": (team_b, user_b, jobs_b)}


@pytest.fixture
def client_a(client, world):
    client.force_login(world["a"][1])
    return client


@pytest.mark.parametrize("name", PAGES)
def test_pages_render_for_a_member(client_a, name):
    response = client_a.get(reverse(f"frontend:{name}"))
    assert response.status_code == 200
    assert b"plotly.min.js" in response.content or name == "job-new"


@pytest.mark.parametrize("name", PAGES + ENDPOINTS)
def test_anonymous_users_are_sent_to_login_or_refused(client, name):
    response = client.get(reverse(f"frontend:{name}"))
    if name.endswith("-data"):
        assert response.status_code == 401
        assert "log in" in response.json()["detail"]
    else:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_overview_data_has_series_scoped_to_the_team(client_a, world):
    data = client_a.get(reverse("frontend:overview-data")).json()
    # 11 + 1 replacement running and 1 preempted in the running job, 4 terminated in the finished one: team A only.
    assert data["nodes_by_state"]["running"] == 12
    assert data["nodes_by_state"]["preempted"] == 1
    assert data["nodes_by_state"]["terminated"] == 4
    assert {j["name"] for j in data["running_jobs"]} == {"gpt-350m-recycle", "mlp-smoke-test"}
    assert Decimal(data["spend_rate_per_hour"]) > 0
    assert Decimal(data["month"]["savings"]) > 0
    assert len(data["daily"]["x"]) == len(data["daily"]["cost"]) == world["now"].day


def test_prices_data_downsamples_and_compares_pools(client_a, world):
    pools = world["pools"]
    keys = [f"{p.instance_type.pk}-{p.zone.pk}" for p in pools[:2]]
    data = client_a.get(reverse("frontend:prices-data"), {"pool": keys, "days": "7"}).json()
    assert data["selected"] == keys
    assert [s["key"] for s in data["series"]] == keys
    # 7 days under 400 points: 30-minute buckets; 300 changes over 20 days -> about 105 in 7 days.
    assert data["bucket_seconds"] == 1800
    for series in data["series"]:
        assert 0 < len(series["x"]) <= 402
        assert len(series["x"]) == len(series["y"]) == len(series["min"]) == len(series["max"])
        assert all(lo <= y <= hi for lo, y, hi in zip(series["min"], series["y"], series["max"], strict=True))
    assert {o["instance_type"] for o in data["on_demand"]} == {p.instance_type.name for p in pools[:2]}
    cheapest = [Decimal(p["price"]) for p in data["cheapest"]]
    assert cheapest == sorted(cheapest) and len(cheapest) == 4
    # The team's own preempted node shows up as an observed interruption in its pool.
    observed = [p["interruption"] for p in data["cheapest"] if p["interruption"]]
    assert any(o["interrupted"] >= 1 for o in observed)


@pytest.mark.parametrize(("params", "field"), [({"days": "abc"}, "days"), ({"days": "0"}, "days"),
                                               ({"pool": "999-999"}, "pool")])
def test_prices_data_rejects_bad_parameters_naming_them(client_a, params, field):
    response = client_a.get(reverse("frontend:prices-data"), params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_fleet_data_groups_instances_and_draws_the_timeline(client_a):
    data = client_a.get(reverse("frontend:fleet-data")).json()
    assert dict(zip(data["by_state"]["x"], data["by_state"]["y"], strict=True)) == {
        "running": 12, "preempted": 1, "terminated": 4}
    assert sum(sum(s["y"]) for s in data["by_zone"]["series"]) == 17
    names = {t["name"] for t in data["timeline"]}
    assert {"notice: interruption", "notice: rebalance", "preempted"} <= names
    assert len(data["live_instances"]) == 12


def test_jobs_data_lists_progress_throughput_and_cost(client_a, world):
    data = client_a.get(reverse("frontend:jobs-data")).json()
    rows = {j["name"]: j for j in data["jobs"]}
    assert set(rows) == {"gpt-350m-recycle", "gpt-125m-checkpoint", "mlp-smoke-test"}
    running = rows["gpt-350m-recycle"]
    assert running["throughput"] > 0 and 0 < running["progress"] < 1
    assert Decimal(running["cost_so_far"]) > 0
    assert rows["mlp-smoke-test"]["throughput"] is None and rows["mlp-smoke-test"]["cost_so_far"] == "0.0000"


def test_job_data_has_curves_layouts_reconfigurations_and_prediction(client_a, world):
    job = world["a"][2]["running"]
    data = client_a.get(reverse("frontend:job-data", args=[job.pk])).json()
    assert data["curves"]["step"][:3] == [0, 1, 2] and len(data["curves"]["loss"]) == 400
    assert [g["number"] for g in data["layouts"]] == [1, 2, 3]
    gen1 = data["layouts"][0]
    assert sum(c["left"] for c in gen1["cells"]) == 1
    assert next(c for c in gen1["cells"] if c["failed"])["state"] == "preempted"
    assert len(data["layouts"][1]["reroutes"]) == 2
    assert [r["trigger"] for r in data["reconfigurations"]] == ["notice", "join"]
    assert data["prediction"]["steps_per_hour"] > 0 and data["prediction"]["predicted_finish"]
    assert data["cost"]["budget"] == 250.0 and data["cost"]["spent"][-1] > 0
    # Burn-down: 12 open segments keep burning until the predicted finish.
    assert Decimal(data["cost"]["rate_per_hour"]) > 0
    assert data["cost"]["projected_at_finish"] > data["cost"]["spent"][-1]


def test_long_metric_histories_are_sampled_by_stride(client_a, world):
    from frontend import selectors

    job = world["a"][2]["running"]
    curves = selectors.job_metric_curves(job=job, max_points=50)
    # 400 steps into at most 50 points: every 8th step, plus the last one so the curve ends now.
    assert curves["stride"] == 8
    assert curves["step"] == [*range(0, 400, 8), 399]
    assert len(curves["loss"]) == len(curves["at"]) == 51


def test_validation_loss_is_a_series_of_its_own_on_the_job_page(client_a, world):
    """Validation passes (val_loss, no loss, one sample per node) are averaged per step into their own
    series; the training curves and the jobs list's latest throughput do not see them."""
    from controlplane.jobs.models import MetricSample

    job = world["a"][2]["running"]
    before = client_a.get(reverse("frontend:job-data", args=[job.pk])).json()["curves"]
    assert before["val_step"] == [] and before["val_loss"] == []
    last = MetricSample.objects.filter(job=job).order_by("-step").first()
    passes = {100: (6.0, 6.2), 200: (4.0, 4.4), last.step: (3.0, 3.0)}
    MetricSample.objects.bulk_create([
        MetricSample(job=job, step=step, at=last.at, val_loss=value)
        for step, values in passes.items() for value in values
    ])
    job.last_val_loss = 3.0
    job.save(update_fields=["last_val_loss"])
    data = client_a.get(reverse("frontend:job-data", args=[job.pk])).json()
    curves = data["curves"]
    assert curves["val_step"] == [100, 200, last.step] and curves["val_loss"] == [6.1, 4.2, 3.0]
    assert data["job"]["last_val_loss"] == 3.0
    for name in ("step", "loss", "samples_per_s", "at"):
        assert curves[name] == before[name], name  # no gap, no extra point in the training curves
    assert None not in curves["loss"]
    rows = {j["name"]: j for j in client_a.get(reverse("frontend:jobs-data")).json()["jobs"]}
    assert rows[job.name]["throughput"] > 0  # the newest sample is a validation pass: not a speed of 0/None
    from frontend import selectors

    sampled = selectors.job_val_curve(job=job, max_points=2)
    assert sampled["val_step"] == [100, last.step]  # every 2nd pass and the last


def test_a_job_with_no_data_renders_everywhere(client_a, world):
    team, _user, _ = world["a"]
    empty = make_job(team, name="fresh")
    for name in JOB_URLS:
        assert client_a.get(reverse(f"frontend:{name}", args=[empty.pk])).status_code == 200, name
    data = client_a.get(reverse("frontend:job-data", args=[empty.pk])).json()
    assert data["curves"]["step"] == [] and data["layouts"] == [] and data["prediction"]["predicted_finish"] is None
    page = client_a.get(reverse("frontend:job-cost", args=[empty.pk])).content.decode()
    assert "No billed capacity yet" in page


def test_a_new_user_with_no_team_sees_what_to_do(client, world):
    client.force_login(make_user(None, username="lonely"))
    assert "not a member of any team" in client.get(reverse("frontend:overview")).content.decode()
    assert client.get(reverse("frontend:jobs-data")).json()["jobs"] == []


@pytest.mark.parametrize("name", JOB_URLS)
def test_another_teams_job_is_not_found_on_every_job_url(client_a, world, name):
    for job in world["b"][2].values():
        response = client_a.get(reverse(f"frontend:{name}", args=[job.pk]))
        assert response.status_code == 404, (name, job.name)


@pytest.mark.parametrize("name", ["job-cancel", "job-resume"])
def test_another_teams_job_cannot_be_cancelled_or_resumed(client_a, world, name):
    job = world["b"][2]["running"]
    assert client_a.post(reverse(f"frontend:{name}", args=[job.pk])).status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


@pytest.mark.parametrize("name", ENDPOINTS)
def test_team_endpoints_show_nothing_of_another_team(client_a, world, name):
    body = client_a.get(reverse(f"frontend:{name}")).content.decode()
    for job in world["b"][2].values():
        assert job.name not in body
    for instance in world["b"][2]["running"].instances.all():
        assert instance.provider_instance_id not in body


def test_cost_report_page_downloads_and_api_agree(client_a, world):
    job = world["a"][2]["finished"]
    api = client_a.get(f"/api/v1/jobs/{job.pk}/cost-report/", HTTP_ACCEPT="application/json").json()
    # 4 nodes x 4 h, all segments closed, so the report does not move with the clock.
    assert Decimal(api["billed_hours"]) == Decimal("16.0000")
    assert Decimal(api["total_usd"]) < Decimal(api["on_demand_equivalent_usd"])
    page_data = client_a.get(reverse("frontend:job-cost-data", args=[job.pk])).json()
    assert page_data["report"]["total_usd"] == api["total_usd"]
    assert sum(line["instances"] for line in page_data["by_pool"]) == 4
    pool_total = sum(Decimal(line["cost_usd"]) for line in page_data["by_pool"])
    assert abs(pool_total - Decimal(api["total_usd"])) <= Decimal("0.01")
    csv_response = client_a.get(reverse("frontend:job-cost-csv", args=[job.pk]))
    assert csv_response["Content-Disposition"].endswith('cost.csv"')
    rows = list(csv.DictReader(io.StringIO(csv_response.content.decode())))
    total = next(r for r in rows if r["segment_id"] == "TOTAL")
    assert total["cost_usd"] == api["total_usd"] and total["on_demand_cost_usd"] == api["on_demand_equivalent_usd"]
    assert len(rows) == 9  # 2 segments per node + the TOTAL line
    download = json.loads(client_a.get(reverse("frontend:job-cost-json", args=[job.pk])).content)
    assert {k: v for k, v in download.items() if k != "as_of"} == {k: v for k, v in api.items() if k != "as_of"}
    page = client_a.get(reverse("frontend:job-cost", args=[job.pk])).content.decode()
    assert f"${api['total_usd']}" in page and f"${api['savings_usd']}" in page


def test_cost_of_work_lost_to_each_preemption(client_a, world):
    job = world["a"][2]["running"]
    data = client_a.get(reverse("frontend:job-cost-data", args=[job.pk])).json()
    losses = data["preemption_losses"]
    assert [loss["lost_seconds"] for loss in losses] == [38.5, 12.0]
    for loss in losses:
        expected = Decimal(str(loss["lost_seconds"])) / 3600 * Decimal(loss["spend_rate_per_hour"])
        assert abs(Decimal(loss["cost_usd"]) - expected) < Decimal("0.0001")
    # The per-event losses add up to billing's total loss.
    assert abs(sum(Decimal(loss["cost_usd"]) for loss in losses) - Decimal(data["report"]["preemption_loss_usd"])) \
        <= Decimal("0.01")


def test_submit_a_job_from_the_dashboard(client_a, world):
    team = world["a"][0]
    deadline = (timezone.now() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    form = {"team": team.pk, "name": "from-the-form", "kind": "gpt", "n_layer": 4, "n_embd": 64, "n_head": 4,
            "seq_len": 32, "vocab_size": 128, "global_batch": 16, "plan_mode": "manual", "dp": 2, "pp": 2,
            "microbatches": 2, "strategy": "recycle", "target_steps": 50, "deadline": deadline,
            "budget_usd": "12.50"}
    response = client_a.post(reverse("frontend:job-new"), form)
    job = TrainingJob.objects.get(name="from-the-form")
    assert response.status_code == 302 and response["Location"] == reverse("frontend:job-detail", args=[job.pk])
    assert job.team == team and job.status == JobStatus.PENDING and job.budget_usd == Decimal("12.50")
    assert (job.config["dp"], job.config["pp"], job.plan["chosen_by"]) == (2, 2, "user")
    assert job.config["model"]["n_head"] == 4 and job.config["microbatches"] == 2
    page = client_a.get(reverse("frontend:job-detail", args=[job.pk])).content.decode()
    assert "Chosen by the submitter" in page and "dp=2 x pp=2" in page


def test_submit_errors_name_the_field_and_write_nothing(client_a, world):
    team = world["a"][0]
    form = {"team": team.pk, "name": "bad", "kind": "gpt", "n_layer": 4, "n_embd": 65, "n_head": 4, "seq_len": 32,
            "vocab_size": 128, "global_batch": 16, "plan_mode": "manual", "dp": 1, "pp": 9, "strategy": "recycle",
            "target_steps": 50, "budget_usd": "5"}
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "n_head" in errors and "pp" in errors  # both problems at once, each on its field
    assert not TrainingJob.objects.filter(name="bad").exists()


def test_submit_a_job_with_a_data_source_from_the_dashboard(client_a, world):
    team = world["a"][0]
    form = {"team": team.pk, "name": "on-real-text", "kind": "gpt", "n_layer": 2, "n_embd": 32, "n_head": 2,
            "seq_len": 16, "vocab_size": 256, "global_batch": 8, "plan_mode": "manual", "dp": 1, "pp": 1,
            "microbatches": 1, "strategy": "recycle", "target_steps": 50, "budget_usd": "3",
            "source": "jsonl:/data/*.jsonl?field=body", "tokenizer": "byte", "val_every": 10}
    page = client_a.get(reverse("frontend:job-new")).content.decode()
    assert 'name="source"' in page and 'name="tokenizer" value="byte"' in page and 'name="val_every" value="0"' in page
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    job = TrainingJob.objects.get(name="on-real-text")
    assert job.config["data"]["source"] == "jsonl:/data/*.jsonl?field=body" and job.config["val_every"] == 10
    assert job.config["data"]["tokenizer"] == "byte"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"source": "csv:/data/x.csv"}, "source"),
        ({"source": "text:/c", "tokenizer": "https://hf.co/t.json"}, "tokenizer"),
        ({"source": "", "val_every": 10}, "val_every"),
        ({"source": "text:/c", "vocab_size": 64}, "vocab_size"),
    ],
)
def test_data_errors_show_next_to_their_field(client_a, world, changes, field):
    form = {"team": world["a"][0].pk, "name": "bad-data", "kind": "gpt", "n_layer": 2, "n_embd": 32, "n_head": 2,
            "seq_len": 16, "vocab_size": 256, "global_batch": 8, "plan_mode": "manual", "dp": 1, "pp": 1,
            "strategy": "recycle", "target_steps": 50, "budget_usd": "3", "tokenizer": "byte", **changes}
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors, errors
    assert f'id="id_{field}-error"' in response.content.decode()
    assert not TrainingJob.objects.filter(name="bad-data").exists()


ADVANCED_BASE = {"kind": "gpt", "n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 256,
                 "global_batch": 8, "plan_mode": "manual", "dp": 1, "pp": 1, "strategy": "recycle",
                 "target_steps": 50, "budget_usd": "3"}


def test_submit_a_preset_with_requirements_and_a_cosine_schedule(client_a, world):
    page = client_a.get(reverse("frontend:job-new")).content.decode()
    # The advanced group is folded until opened; the presets are offered by name.
    assert '<details class="group"><summary>Advanced training</summary>' in page
    assert '<option value="gpt-nano">' in page and '<option value="cosine" ' not in page.split("lr_schedule")[0]
    form = {**ADVANCED_BASE, "team": world["a"][0].pk, "name": "preset-cosine", "model": "gpt-nano",
            "requirements": "numpy>=1.26\r\n\r\n  s3://bucket/pkgs/mypkg-1.0-py3-none-any.whl  \r\n",
            "init_from": "s3://bucket/runs/first", "lr": "0.003", "lr_schedule": "cosine", "warmup_steps": "10",
            "lr_min": "0.0003", "clip": "1.0", "precision": "bf16", "device": "cuda"}
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    config = TrainingJob.objects.get(name="preset-cosine").config
    assert {k: config["model"][k] for k in MODEL_PRESETS["gpt-nano"]} == MODEL_PRESETS["gpt-nano"]
    assert config["requirements"] == ["numpy>=1.26", "s3://bucket/pkgs/mypkg-1.0-py3-none-any.whl"]
    assert (config["init_from"], config["lr"], config["lr_schedule"], config["warmup_steps"], config["lr_min"],
            config["clip"], config["precision"], config["device"]) == (
        "s3://bucket/runs/first", 0.003, "cosine", 10, 0.0003, 1.0, "bf16", "cuda")
    # The device choice is the runtime's (DEVICES), offered with JobConfig's default selected.
    assert '<option value="cpu" selected>cpu</option>' in page and '<option value="cuda">cuda</option>' in page


def test_submit_a_model_function_with_its_arguments(client_a, world):
    form = {**ADVANCED_BASE, "team": world["a"][0].pk, "name": "user-model", "model": "mypkg.models:build",
            "model_args": '{"width": 64, "blocks": [1, 2]}', "model_layers": "6"}
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    model = TrainingJob.objects.get(name="user-model").config["model"]
    assert (model["kind"], model["path"], model["args"], model["layers"]) == (
        "py", "mypkg.models:build", {"width": 64, "blocks": [1, 2]}, 6)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"model": "gpt3"}, "model", "model 'gpt3' is unknown; expected one of"),
        ({"model": "my-pkg.models:build", "model_layers": "4"}, "model", "model.path 'my-pkg.models:build' is invalid"),
        ({"model": "mypkg.models:build"}, "model_layers", "model.layers is not set for the model function"),
        ({"model": "mypkg:build", "model_layers": "4", "model_args": "{width: 64}"}, "model_args", "not JSON"),
        ({"model": "mypkg:build", "model_args": "[64]"}, "model_args", "expected a JSON object"),
        ({"model": "gpt-nano", "model_args": '{"width": 64}'}, "model_args", "model.args is for a user's model"),
        ({"model": "mypkg:build", "model_layers": "4", "model_args": "[" * 100_000}, "model_args", "nested too deeply"),
        ({"model": "mypkg:build", "model_layers": "4", "model_args": '{"w": "\\ud800"}'}, "model_args",
         "lone surrogate"),
        ({"requirements": "numpy\n--index-url=http://evil"}, "requirements", "requirements[1] '--index-url"),
        ({"requirements": "upload:" + "0" * 64}, "requirements", "among your team's uploads"),
        ({"lr_schedule": "linear"}, "lr_schedule", "Select a valid choice"),
        ({"lr_schedule": "cosine", "lr_min": "0.5"}, "lr_min", "lr_min=0.5 must be between 0 and lr=0.01"),
        ({"clip": "-1"}, "clip", "clip=-1.0 must be >= 0"),
        ({"device": "tpu"}, "device", "Select a valid choice"),
    ],
)
def test_advanced_errors_show_on_their_field_and_write_nothing(client_a, world, changes, field, message):
    form = {**ADVANCED_BASE, "team": world["a"][0].pk, "name": "bad-advanced", **changes}
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and message in " ".join(errors[field]), errors
    page = response.content.decode()
    assert f'id="id_{field}-error"' in page
    if not field.startswith("model"):  # the folded group opens to show its error
        assert '<details class="group" open><summary>Advanced training</summary>' in page
    assert not TrainingJob.objects.filter(name="bad-advanced").exists()


def test_submit_cannot_target_another_team(client_a, world):
    form = {"team": world["b"][0].pk, "name": "sneaky", "kind": "mlp", "n_layer": 2, "n_embd": 8,
            "global_batch": 4, "plan_mode": "auto", "strategy": "auto", "target_steps": 5, "budget_usd": "1"}
    response = client_a.post(reverse("frontend:job-new"), form)
    assert response.status_code == 400 and "team" in response.context["form"].errors
    assert not TrainingJob.objects.filter(name="sneaky").exists()


def test_cancel_then_resume_from_the_dashboard(client_a, world):
    job = world["a"][2]["running"]
    refused = client_a.post(reverse("frontend:job-cancel", args=[job.pk]), {"reason": "done\x00"}, follow=True)
    assert "reason contains a NUL character" in refused.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    client_a.post(reverse("frontend:job-cancel", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    again = client_a.post(reverse("frontend:job-cancel", args=[job.pk]), follow=True)
    assert "cancel is allowed only from" in again.content.decode()
    client_a.post(reverse("frontend:job-resume", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_fleet_data_lists_unavailable_offerings_with_their_expiry(client_a):
    from controlplane.orchestration.offerings import offerings_mark_no_capacity
    from controlplane.orchestration.providers.base import Pool

    offerings_mark_no_capacity(provider="aws", pools=[Pool(instance_type="p3.2xlarge", zone="us-east-1a")],
                               capacity_type="spot", code="InsufficientInstanceCapacity")
    data = client_a.get(reverse("frontend:fleet-data")).json()
    marks = [u for u in data["unavailable_offerings"] if u["reason"] == "no_capacity"]
    assert [(u["pool"], u["code"]) for u in marks] == [("p3.2xlarge@us-east-1a", "InsufficientInstanceCapacity")]
    assert marks[0]["until"] > data["generated_at"]


def test_job_data_carries_the_capacity_policy_and_the_spot_on_demand_split(client_a, world):
    from controlplane.billing.services import billing_backfill
    from tests.controlplane.factories import make_instance, make_instance_type, make_spot_prices, make_zone

    team, now = world["a"][0], timezone.now()
    job = make_job(team, capacity="spot_then_on_demand")
    unreachable = now - timedelta(hours=1)
    TrainingJob.objects.filter(pk=job.pk).update(capacity_type="on_demand", deadline_unreachable_at=unreachable)
    # A pool of its own (not in the seeded market): 3 h on spot at 0.30, then 2 h on demand at 1.34.
    itype, zone = make_instance_type("trn1.2xlarge", "1.34"), make_zone("us-west-2a", "usw2-az1")
    make_spot_prices(itype, zone, [(now - timedelta(hours=10), "0.30")])
    for lifecycle, start, end in (("spot", 6, 3), ("on_demand", 3, 1)):
        billing_backfill(instance=make_instance(team, job=job, instance_type=itype, zone=zone, lifecycle=lifecycle,
                                                running_at=now - timedelta(hours=start),
                                                ended_at=now - timedelta(hours=end), state="terminated"))
    data = client_a.get(reverse("frontend:job-data", args=[job.pk])).json()
    assert (data["job"]["capacity"], data["job"]["capacity_type"]) == ("spot_then_on_demand", "on_demand")
    assert data["job"]["deadline_unreachable_at"] == unreachable.isoformat()
    split = data["cost"]["by_capacity_type"]
    assert split == {"spot": {"hours": "3.000", "cost_usd": "0.9000"}, "on_demand": {"hours": "2.000",
                                                                                     "cost_usd": "2.6800"}}
    assert sum(Decimal(line["cost_usd"]) for line in split.values()) == Decimal(data["cost"]["total"])
    # The API's cost report splits it the same way.
    api = client_a.get(f"/api/v1/jobs/{job.pk}/cost-report/", HTTP_ACCEPT="application/json").json()
    for kind in ("spot", "on_demand"):
        assert Decimal(api["by_capacity_type"][kind]["hours"]) == Decimal(split[kind]["hours"])
        assert api["by_capacity_type"][kind]["cost_usd"] == str(Decimal(split[kind]["cost_usd"]).quantize(
            Decimal("0.01")))
    page = client_a.get(reverse("frontend:job-detail", args=[job.pk])).content.decode()
    assert "Capacity policy <strong>spot_then_on_demand</strong>" in page
    assert 'id="job-capacity-type">on_demand<' in page
    assert 'id="deadline-unreachable">' in page  # shown, not hidden
    cost_page = client_a.get(reverse("frontend:job-cost", args=[job.pk])).content.decode()
    assert 'id="by-capacity-type"' in cost_page and "$2.68" in cost_page and "$0.90" in cost_page
