"""`GET /api/v1/teams/{id}/spend/`: a team's spend per UTC day and per job, JSON and CSV, team-scoped."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from controlplane.billing.models import BillingSegment, PriceSource
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_instance, make_job

pytestmark = pytest.mark.django_db
# 22:00 on May 30: each 4-hour segment below crosses midnight UTC.
T0 = datetime(2022, 5, 30, 22, 0, tzinfo=UTC)


def _segment(instance, job, start, hours, price, od="3.00"):
    return BillingSegment.objects.create(
        instance=instance, team=instance.team, job=job, start=start,
        end=None if hours is None else start + timedelta(hours=hours),
        price_per_hour=Decimal(price), on_demand_price_per_hour=Decimal(od), price_source=PriceSource.SPOT,
    )


@pytest.fixture
def worlds():
    alpha, beta = make_team_world("alpha"), make_team_world("beta")
    second_job = make_job(alpha.team, name="second")
    other = make_instance(alpha.team, job=second_job)
    idle = make_instance(alpha.team, job=None)
    _segment(alpha.instance, alpha.job, T0, 4, "1.00")  # 2 h on May 30, 2 h on May 31
    _segment(other, second_job, T0 + timedelta(days=1), 1, "0.50")  # 1 h on May 31 (22:00-23:00)
    _segment(idle, None, T0 + timedelta(hours=3), 1, "0.25")  # no job, May 31
    _segment(beta.instance, beta.job, T0, 4, "9.00")  # beta's: never in alpha's report
    return alpha, beta, second_job


def test_per_day_and_per_job(worlds):
    alpha, _, second_job = worlds
    response = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/",
                                       {"start": "2022-05-30", "end": "2022-06-01"})
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["total_usd"] == "4.75" and data["billed_hours"] == "6.0000"
    assert data["on_demand_equivalent_usd"] == "18.00" and data["savings_usd"] == "13.25"
    assert [(d["day"], d["cost_usd"]) for d in data["by_day"]] == [
        ("2022-05-30", "2.00"), ("2022-05-31", "2.75"), ("2022-06-01", "0.00")]
    assert [(j["job"], j["cost_usd"]) for j in data["by_job"]] == [
        (alpha.job.pk, "4.00"), (second_job.pk, "0.50"), (None, "0.25")]
    assert data["by_job"][2]["job_name"] == "(no job)"


def test_window_clips_segments_and_lists_idle_days(worlds):
    alpha, _, _ = worlds
    data = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/",
                                   {"start": "2022-05-31", "end": "2022-05-31"}).json()
    assert data["total_usd"] == "2.75" and [d["day"] for d in data["by_day"]] == ["2022-05-31"]
    idle = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/",
                                   {"start": "2021-01-01", "end": "2021-01-03"}).json()
    assert [d["cost_usd"] for d in idle["by_day"]] == ["0.00"] * 3 and idle["by_job"] == []


def test_open_segment_is_costed_until_now(worlds):
    alpha, _, _ = worlds
    now = datetime.now(UTC)
    _segment(alpha.instance, alpha.job, now - timedelta(minutes=30), None, "2.00")
    # From the segment's first day: in the half hour after midnight UTC it began yesterday.
    start, end = (now - timedelta(minutes=30)).date().isoformat(), now.date().isoformat()
    data = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/", {"start": start, "end": end}).json()
    assert Decimal("0.90") <= Decimal(data["total_usd"]) <= Decimal("1.10")


@pytest.mark.parametrize("how", ["query", "accept"])
def test_csv(worlds, how):
    alpha, _, second_job = worlds
    url = f"/api/v1/teams/{alpha.team.pk}/spend/"
    params = {"start": "2022-05-30", "end": "2022-06-01"}
    response = (alpha.member_client.get(url, {**params, "format": "csv"}) if how == "query"
                else alpha.member_client.get(url, params, HTTP_ACCEPT="text/csv"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    cells = [(r["day"], r["job"], r["cost_usd"]) for r in rows[:-1]]
    assert cells == [("2022-05-30", str(alpha.job.pk), "2.00"), ("2022-05-31", "", "0.25"),
                     ("2022-05-31", str(alpha.job.pk), "2.00"), ("2022-05-31", str(second_job.pk), "0.50")]
    assert rows[-1]["day"] == "TOTAL" and rows[-1]["cost_usd"] == "4.75"


def test_another_team_is_404_and_agents_anonymous_refused(worlds):
    alpha, beta, _ = worlds
    assert alpha.admin_client.get(f"/api/v1/teams/{beta.team.pk}/spend/").status_code == 404
    assert alpha.admin_client.get(f"/api/v1/teams/{beta.team.pk}/spend/", {"format": "csv"}).status_code == 404
    assert alpha.admin_client.get("/api/v1/teams/999999/spend/").status_code == 404
    assert alpha.agent_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/").status_code == 403
    from tests.controlplane.api_helpers import token_client
    assert token_client().get(f"/api/v1/teams/{alpha.team.pk}/spend/").status_code == 401


@pytest.mark.parametrize("params, field", [
    ({"start": "yesterday"}, "start"),
    ({"end": "2022-13-01"}, "end"),
    ({"start": "2022-06-02", "end": "2022-06-01"}, "end"),
    ({"start": "2020-01-01", "end": "2022-01-01"}, "end"),
])
def test_bad_window_is_400_naming_the_field(worlds, params, field):
    alpha, _, _ = worlds
    response = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/", params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


@pytest.mark.parametrize("params", [
    {"start": "9999-12-01", "end": "9999-12-31"},  # the midnight after `end` overflowed: a 500
    {"end": "9999-12-31"},
])
def test_a_window_ending_on_the_last_date_is_400_naming_end(worlds, client, params):
    """The API and the dashboard's downloads apply the one window rule (`spend_window_problem`)."""
    alpha, _, _ = worlds
    response = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/", params)
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"end": ["end must be before 9999-12-31"]}
    client.force_login(alpha.member)
    for name in ("frontend:team-spend-csv", "frontend:team-spend-json"):
        response = client.get(reverse(name, args=[alpha.team.slug]), params)
        assert response.status_code == 400, response.content
        assert response.json()["errors"] == {"end": ["end must be before 9999-12-31"]}


def test_a_window_near_the_first_date_is_answered(worlds):
    """The default start, 29 days before `end`, stops at the first date there is."""
    alpha, _, _ = worlds
    response = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/spend/", {"end": "0001-01-05"})
    assert response.status_code == 200, response.content
    assert [d["day"] for d in response.json()["by_day"]] == [f"0001-01-0{n}" for n in range(1, 6)]
