"""Billing API: team isolation of segments and cost reports, JSON and CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from controlplane.billing.reports import job_cost_report
from controlplane.billing.services import billing_backfill
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_instance, make_instance_type, make_spot_prices, make_zone

pytestmark = pytest.mark.django_db
T0 = datetime(2022, 5, 31, 12, 0, tzinfo=UTC)


@pytest.fixture
def worlds():
    """Two teams, each with a job whose instance ran 3 h across one price change."""
    itype, zone = make_instance_type("p3.2xlarge", "3.06"), make_zone()
    make_spot_prices(itype, zone, [(T0 - timedelta(hours=1), "0.918"), (T0 + timedelta(hours=1), "1.2")])
    result = []
    for slug in ("alpha", "beta"):
        world = make_team_world(slug)
        instance = make_instance(world.team, job=world.job, instance_type=itype, zone=zone, running_at=T0,
                                 ended_at=T0 + timedelta(hours=3), state="terminated")
        billing_backfill(instance=instance)
        result.append(world)
    return result


def test_segments_are_team_scoped(worlds):
    alpha, beta = worlds
    response = alpha.member_client.get("/api/v1/billing/segments/", {"job": alpha.job.pk})
    assert response.status_code == 200
    rows = response.json()["results"]
    assert len(rows) == 2 and {r["job"] for r in rows} == {alpha.job.pk}
    assert [r["price_per_hour"] for r in rows] == ["0.918000", "1.200000"]
    # Another team's job id filters to nothing; no listing ever shows beta's segments.
    assert alpha.member_client.get("/api/v1/billing/segments/", {"job": beta.job.pk}).json()["results"] == []
    everything = alpha.member_client.get("/api/v1/billing/segments/").json()["results"]
    assert {r["team"] for r in everything} == {alpha.team.pk}


def test_cost_report_json_and_other_teams_job_is_404(worlds):
    alpha, beta = worlds
    response = alpha.member_client.get(f"/api/v1/jobs/{alpha.job.pk}/cost-report/")
    assert response.status_code == 200
    data = response.json()
    expected = Decimal("0.918") + 2 * Decimal("1.2")
    assert data["total_usd"] == str(expected.quantize(Decimal("0.01")))
    assert data["billed_hours"] == "3.0000"
    assert data["on_demand_equivalent_usd"] == str((3 * Decimal("3.06")).quantize(Decimal("0.01")))
    assert len(data["segments"]) == 2
    assert alpha.member_client.get(f"/api/v1/jobs/{beta.job.pk}/cost-report/").status_code == 404
    assert alpha.member_client.get("/api/v1/jobs/999999/cost-report/").status_code == 404


@pytest.mark.parametrize("how", ["query", "accept"])
def test_cost_report_csv(worlds, how):
    alpha, beta = worlds
    url = f"/api/v1/jobs/{alpha.job.pk}/cost-report/"
    response = (alpha.member_client.get(url, {"format": "csv"}) if how == "query"
                else alpha.member_client.get(url, HTTP_ACCEPT="text/csv"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["price_per_hour"] for r in rows[:-1]] == ["0.918000", "1.200000"]
    assert rows[-1]["segment_id"] == "TOTAL"
    assert rows[-1]["cost_usd"] == job_cost_report(job=alpha.job).to_dict()["total_usd"]
    # Another team's job is 404 in CSV too.
    assert alpha.member_client.get(f"/api/v1/jobs/{beta.job.pk}/cost-report/", {"format": "csv"}).status_code == 404


def test_agents_and_anonymous_get_no_costs(worlds):
    alpha, _ = worlds
    assert alpha.agent_client.get(f"/api/v1/jobs/{alpha.job.pk}/cost-report/").status_code == 403
    assert alpha.agent_client.get("/api/v1/billing/segments/").status_code == 403
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/billing/segments/").status_code in (401, 403)


@pytest.mark.parametrize(("params", "field"), [({"job": "abc"}, "job"), ({"instance": "-1"}, "instance")])
def test_segment_filters_400_naming_the_parameter(worlds, params, field):
    response = worlds[0].member_client.get("/api/v1/billing/segments/", params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_cost_report_bad_as_of_is_400(worlds):
    alpha, _ = worlds
    response = alpha.member_client.get(f"/api/v1/jobs/{alpha.job.pk}/cost-report/", {"as_of": "tomorrow"})
    assert response.status_code == 400 and "as_of" in response.json()["errors"]
