"""The dashboard in headless Chromium (Debian's package, driven by Playwright) against a live
server: log in, every page draws real charts, the job page updates without a reload, submit a
job, download a cost report and check it against the API, and a user of team A reaches none of
team B's pages or data by URL."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.accounts.models import Role
from controlplane.jobs.models import MetricSample, TrainingJob
from frontend import browser
from spotpipe.demo import history as demo_history
from tests.controlplane.factories import make_team, make_user

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

PASSWORD = "correct-horse-battery-staple"  # what tests.controlplane.factories.make_user sets


@pytest.fixture
def world(chromium):
    now = timezone.now()
    pools = demo_history.ensure_market(pools=4)
    demo_history.load_prices(demo_history.price_rows(pools=pools, start=now - timedelta(days=15), end=now,
                                               changes_per_pool=200))
    team_a, team_b = make_team("alpha"), make_team("beta")
    user_a = make_user(team_a, role=Role.ADMIN, username="alice")
    user_b = make_user(team_b, username="bob")
    jobs_a = demo_history.seed_team_activity(team=team_a, user=user_a, pools=pools, now=now, metric_steps=300)
    jobs_b = demo_history.seed_team_activity(team=team_b, user=user_b, pools=pools, now=now, metric_steps=300,
                                          prefix="b-")
    return {"a": (team_a, user_a, jobs_a), "b": (team_b, user_b, jobs_b)}


def _login_a(page, live_server, world):
    browser.login(page, live_server.url, world["a"][1].username, PASSWORD)


CHARTS = {
    "/": ["chart-nodes", "chart-daily"],
    "/prices/": ["chart-prices"],
    "/fleet/": ["chart-state", "chart-zone", "chart-type", "chart-timeline"],
    "/notices/": ["chart-processing"],
}


def test_login_and_every_page_draws_its_charts(page, live_server, world):
    _login_a(page, live_server, world)
    running, finished = world["a"][2]["running"], world["a"][2]["finished"]
    charts = {**CHARTS, f"/jobs/{running.pk}/": ["chart-loss", "chart-throughput", "chart-cost", "chart-progress",
                                                 "chart-reconf"],
              f"/jobs/{finished.pk}/cost/": ["chart-cost-pools"]}
    for path, chart_ids in charts.items():
        page.goto(live_server.url + path)
        browser.wait_loaded(page)
        for chart_id in chart_ids:
            assert browser.drawn_points(page, chart_id) > 0, f"{path} #{chart_id} drew no points"
    page.goto(live_server.url + "/jobs/")
    browser.wait_loaded(page)
    rows = page.locator("#table-jobs tbody tr")
    assert rows.count() == 3
    assert "gpt-350m-recycle" in page.locator("#table-jobs").inner_text()
    page.goto(f"{live_server.url}/jobs/{running.pk}/")
    browser.wait_loaded(page)
    # The current generation (3) is drawn in full; 2 and 1 are one line each with what changed.
    assert page.locator(".generation").count() == 1
    assert "Generation 3 (current)" in page.locator(".generation figcaption").inner_text()
    lines = page.locator(".generation-line")
    assert lines.count() == 2
    assert "left:" in lines.nth(0).inner_text() and "2 re-route(s)" in lines.nth(0).inner_text()
    assert "12 node(s), dp=3 x pp=4" in lines.nth(1).inner_text()


def test_prices_compare_pools_picked_in_the_form(page, live_server, world):
    _login_a(page, live_server, world)
    page.goto(live_server.url + "/prices/")
    browser.wait_loaded(page)
    options = page.locator("#pool-select option")
    assert options.count() == 4
    values = [options.nth(i).get_attribute("value") for i in range(4)]
    page.select_option("#pool-select", values)
    with page.expect_response(lambda r: "/data/prices.json" in r.url and r.status == 200):
        page.get_by_role("button", name="Show").click()
    # Four pools, plus one on-demand line per distinct instance type among them.
    page.wait_for_function("(() => { const d = document.getElementById('chart-prices').data; return d.filter("
                           "t => !t.name.endsWith('on-demand') && !t.name.endsWith('range')).length === 4; })()")
    assert browser.drawn_points(page, "chart-prices") > 0


def test_job_page_updates_without_reload(page, live_server, world):
    _login_a(page, live_server, world)
    job = world["a"][2]["running"]
    page.goto(f"{live_server.url}/jobs/{job.pk}/?poll=500")
    browser.wait_loaded(page)
    before = browser.drawn_points(page, "chart-loss")
    page.evaluate("window.__sameDocument = true")
    last = MetricSample.objects.filter(job=job).order_by("-step").first()
    MetricSample.objects.bulk_create([
        MetricSample(job=job, step=last.step + k, at=last.at + timedelta(seconds=k), loss=1.5, samples_per_s=9.0)
        for k in range(1, 6)
    ])
    page.wait_for_function(f"document.getElementById('chart-loss').data[0].x.length > {before}")
    assert page.evaluate("window.__sameDocument") is True
    assert browser.drawn_points(page, "chart-loss") == before + 5


def test_job_page_plots_the_validation_loss_beside_the_training_loss(page, live_server, world):
    _login_a(page, live_server, world)
    job = world["a"][2]["running"]
    page.goto(f"{live_server.url}/jobs/{job.pk}/?poll=500")
    browser.wait_loaded(page)
    assert page.evaluate("document.getElementById('chart-loss').data.length") == 1  # no validation yet
    last = MetricSample.objects.filter(job=job).order_by("-step").first()
    # Two nodes report each validation pass (val_loss, no loss); the page averages them per step.
    MetricSample.objects.bulk_create([
        MetricSample(job=job, step=step, at=last.at, val_loss=value)
        for step, values in ((100, (6.0, 6.2)), (200, (4.0, 4.4)), (last.step, (3.0, 3.0))) for value in values
    ])
    page.wait_for_function("document.getElementById('chart-loss').data.length === 2")
    traces = page.evaluate("document.getElementById('chart-loss').data.map("
                           "t => ({name: t.name, mode: t.mode, x: Array.from(t.x), y: Array.from(t.y)}))")
    training, validation = traces
    assert training["name"].startswith("training loss") and None not in training["y"]
    assert validation["name"] == "validation loss" and "markers" in validation["mode"]
    assert validation["x"] == [100, 200, last.step] and validation["y"] == [6.1, 4.2, 3.0]
    assert "validation loss" in page.locator("#chart-loss g.legend").text_content()  # drawn, with its legend


def test_submit_a_job_with_a_data_source(page, live_server, world):
    _login_a(page, live_server, world)
    page.goto(live_server.url + "/jobs/new/")
    page.get_by_label("Name").fill("browser-data")
    page.get_by_label("Budget (USD)").fill("20")
    page.get_by_label("Vocabulary").fill("256")
    page.get_by_label("Data source (FORMAT:LOCATION)").fill("text:/no/such/scheme://x")
    page.get_by_label("Validate every (steps, 0: never)").fill("25")
    page.get_by_role("button", name="Submit job").click()
    error = page.locator("#id_source-error")
    assert "data.source" in error.inner_text()  # the runtime's message, next to the field
    assert page.get_by_label("Validate every (steps, 0: never)").input_value() == "25"  # the rest is kept
    page.get_by_label("Data source (FORMAT:LOCATION)").fill("text:/srv/corpus/")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(f"{live_server.url}/jobs/*/")
    job = TrainingJob.objects.get(name="browser-data")
    assert job.config["data"]["source"] == "text:/srv/corpus/" and job.config["val_every"] == 25
    assert job.config["data"]["tokenizer"] == "byte"


def test_submit_a_job_and_see_its_empty_states(page, live_server, world):
    _login_a(page, live_server, world)
    page.goto(live_server.url + "/jobs/")
    page.get_by_role("link", name="Submit a job").click()
    page.get_by_label("Name").fill("browser-submitted")
    page.get_by_label("Strategy").select_option("bamboo")
    page.get_by_label("Target steps").fill("250")
    page.get_by_label("Budget (USD)").fill("20")
    page.get_by_label("Model preset or function").fill("gpt-nano")
    # The advanced training fields are folded away until their group is opened.
    schedule = page.get_by_label("Learning-rate schedule")
    assert not schedule.is_visible()
    page.locator("summary", has_text="Advanced training").click()
    schedule.select_option("cosine")
    page.get_by_label("Warmup steps").fill("5")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(f"{live_server.url}/jobs/*/")
    browser.wait_loaded(page)
    assert "submitted" in page.locator(".messages").inner_text()
    job = TrainingJob.objects.get(name="browser-submitted")
    assert job.team == world["a"][0] and job.strategy == "bamboo" and job.budget_usd == Decimal("20.00")
    assert (job.config["model"]["n_embd"], job.config["lr_schedule"], job.config["warmup_steps"]) == (128, "cosine", 5)
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert page.locator("#empty-metrics").is_visible()
    assert browser.drawn_points(page, "chart-loss") == 0
    assert "No loss reported yet" in page.locator("#chart-loss").inner_text()


def test_submit_with_a_deadline_and_let_the_planner_choose(page, live_server, world):
    # 1,000 steps of the form's default GPT take one local node about 8 minutes by its profile
    # (8 micro-batches x 10 layers x 6 ms a step): a deadline in 5 minutes needs more nodes.
    _login_a(page, live_server, world)
    page.goto(live_server.url + "/jobs/new/")
    page.get_by_label("Name").fill("browser-planned")
    page.get_by_label("Target steps").fill("1000")
    page.get_by_label("Let the planner choose").check()
    deadline = (timezone.now() + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M")
    page.get_by_label("Deadline (UTC)").fill(deadline)
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(f"{live_server.url}/jobs/*/")
    browser.wait_loaded(page)
    job = TrainingJob.objects.get(name="browser-planned")
    assert job.plan["chosen_by"] == "planner" and job.config["dp"] * job.config["pp"] > 1, job.plan
    layout = page.locator("#plan-layout").inner_text()
    assert "Chosen by the planner" in layout and f"dp={job.config['dp']} x pp={job.config['pp']}" in layout
    predicted_hours = page.locator("#plan-table tr", has_text="hours for the whole job").locator("td").first
    assert float(predicted_hours.inner_text()) == pytest.approx(job.plan["predicted"]["hours"], rel=1e-3)

    # A layout the runtime cannot run comes back on the form, on its field.
    page.goto(live_server.url + "/jobs/new/")
    page.get_by_label("Name").fill("browser-impossible")
    page.get_by_label("I choose the layout").check()
    page.get_by_label("Pipeline stages (pp)").fill("40")
    page.get_by_label("Budget (USD)").fill("20")
    page.get_by_role("button", name="Submit job").click()
    assert "pp=40 stages but the model has only 10 layers" in page.locator("#id_pp-error").inner_text()
    assert not TrainingJob.objects.filter(name="browser-impossible").exists()


def test_download_cost_report_and_check_totals_against_the_api(page, live_server, world):
    _login_a(page, live_server, world)
    job = world["a"][2]["finished"]
    page.goto(f"{live_server.url}/jobs/{job.pk}/cost/")
    browser.wait_loaded(page)
    with page.expect_download() as info:
        page.locator("#download-csv").click()
    rows = list(csv.DictReader(io.StringIO(Path(info.value.path()).read_text(encoding="utf-8"))))
    with page.expect_download() as info_json:
        page.locator("#download-json").click()
    downloaded = json.loads(Path(info_json.value.path()).read_text(encoding="utf-8"))
    api = page.request.get(f"{live_server.url}/api/v1/jobs/{job.pk}/cost-report/",
                           headers={"Accept": "application/json"}).json()
    total_row = next(r for r in rows if r["segment_id"] == "TOTAL")
    assert total_row["cost_usd"] == api["total_usd"]
    assert total_row["on_demand_cost_usd"] == api["on_demand_equivalent_usd"]
    segments_sum = sum(Decimal(r["cost_usd"]) for r in rows if r["segment_id"] != "TOTAL")
    assert abs(segments_sum - Decimal(api["total_usd"])) <= Decimal("0.01")
    assert downloaded["total_usd"] == api["total_usd"] and downloaded["savings_usd"] == api["savings_usd"]
    assert page.locator("#total-cost").inner_text() == f"${api['total_usd']}"
    assert Decimal(api["total_usd"]) > 0 and Decimal(api["savings_usd"]) > 0


def test_job_page_downloads_the_weights_and_shows_how_to_load_them(page, live_server, world, tmp_path, settings):
    from controlplane.jobs.artifacts import job_artifacts_location
    from runtime.checkpointing.export import export_model
    from runtime.config import ModelSpec
    from runtime.models.model import build_model

    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    job = world["a"][2]["finished"]
    spec = ModelSpec(kind="mlp", n_layer=1, n_embd=8)
    folder = Path(job_artifacts_location(job=job))
    export_model(folder, build_model(spec, 0), spec=spec)
    _login_a(page, live_server, world)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    browser.wait_loaded(page)
    assert "spotpipe.load_model" in page.locator("#artifacts-snippet").inner_text()
    with page.expect_download() as info:
        page.locator("#artifacts-table a", has_text="model.safetensors").click()
    assert Path(info.value.path()).read_bytes() == (folder / "model.safetensors").read_bytes()
    assert info.value.suggested_filename == "model.safetensors"


def _team_b_urls(world) -> list[str]:
    urls = []
    for job in world["b"][2].values():
        urls += [f"/jobs/{job.pk}/", f"/jobs/{job.pk}/cost/", f"/jobs/{job.pk}/cost.csv", f"/jobs/{job.pk}/cost.json",
                 f"/data/jobs/{job.pk}.json", f"/data/jobs/{job.pk}/cost.json"]
    return urls


def test_a_user_of_team_a_cannot_reach_team_b_by_url(page, live_server, world):
    _login_a(page, live_server, world)
    for path in _team_b_urls(world):
        response = page.request.get(live_server.url + path)
        assert response.status == 404, path
    for job in world["b"][2].values():
        for action in ("cancel", "resume"):
            csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
            response = page.request.post(f"{live_server.url}/jobs/{job.pk}/{action}/", headers={"X-CSRFToken": csrf})
            assert response.status == 404, (action, job.name)
    secrets = [job.name for job in world["b"][2].values()]
    secrets += list(world["b"][2]["running"].instances.values_list("provider_instance_id", flat=True))
    for path in ["/data/overview.json", "/data/fleet.json", "/data/jobs.json", "/data/notices.json",
                 "/data/prices.json"]:
        body = page.request.get(live_server.url + path).text()
        leaked = [s for s in secrets if s in body]
        assert not leaked, (path, leaked)
    # The rendered pages too (what the script drew from those endpoints, and the tables).
    for path in ["/", "/fleet/", "/jobs/", "/notices/"]:
        page.goto(live_server.url + path)
        browser.wait_loaded(page)
        shown = page.content()
        leaked = [s for s in secrets if s in shown]
        assert not leaked, (path, leaked)


def test_the_fleet_page_lists_unavailable_offerings(page, live_server, world):
    from controlplane.orchestration.offerings import offerings_mark_no_capacity
    from controlplane.orchestration.providers.base import Pool

    offerings_mark_no_capacity(provider="aws", pools=[Pool(instance_type="p3.2xlarge", zone="us-east-1a")],
                               capacity_type="spot", code="InsufficientInstanceCapacity")
    _login_a(page, live_server, world)
    page.goto(live_server.url + "/fleet/")
    browser.wait_loaded(page)
    rows = page.locator("#table-unavailable tbody tr")
    rows.first.wait_for()
    text = page.locator("#table-unavailable").inner_text()
    assert "p3.2xlarge@us-east-1a" in text and "no capacity (InsufficientInstanceCapacity)" in text
