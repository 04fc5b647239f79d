"""A job's cost report: totals equal the segments, breakdowns, on-demand equivalent, savings and
the cost of work lost to preemptions."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from controlplane.billing.reports import exact_hours, job_cost_report
from controlplane.billing.services import billing_backfill
from controlplane.jobs.models import Reconfiguration, TrainingJob
from tests.controlplane.factories import (
    make_instance,
    make_instance_type,
    make_job,
    make_spot_prices,
    make_team,
    make_zone,
)

pytestmark = pytest.mark.django_db
T0 = datetime(2022, 5, 31, 12, 0, tzinfo=UTC)


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


@pytest.fixture
def job_with_fleet():
    """Two p3.2xlarge in two zones and one g4dn.xlarge, with price changes mid-life."""
    team = make_team()
    job = make_job(team)
    p3, g4 = make_instance_type("p3.2xlarge", "3.06"), make_instance_type("g4dn.xlarge", "0.526")
    az4, az6 = make_zone("us-east-1a", "use1-az4"), make_zone("us-east-1b", "use1-az6")
    make_spot_prices(p3, az4, [(h(-1), "0.9180"), (h(1.5), "1.1000")])
    make_spot_prices(p3, az6, [(h(-1), "0.9500")])
    make_spot_prices(g4, az4, [(h(-1), "0.1578"), (h(2), "0.1700")])
    instances = [
        make_instance(team, job=job, instance_type=p3, zone=az4, running_at=h(0), ended_at=h(3), state="preempted"),
        make_instance(team, job=job, instance_type=p3, zone=az6, running_at=h(0), ended_at=h(2.5),
                      state="terminated"),
        make_instance(team, job=job, instance_type=g4, zone=az4, running_at=h(1), ended_at=h(4), state="terminated"),
    ]
    for instance in instances:
        billing_backfill(instance=instance)
    return job


def expected_total() -> Decimal:
    # p3 az4: 1.5 h x 0.918 + 1.5 h x 1.1; p3 az6: 2.5 h x 0.95; g4 az4: 1 h x 0.1578 + 2 h x 0.17
    return (Decimal("1.5") * Decimal("0.918") + Decimal("1.5") * Decimal("1.1") + Decimal("2.5") * Decimal("0.95")
            + Decimal("0.1578") + 2 * Decimal("0.17"))


def test_totals_equal_the_sum_of_segments(job_with_fleet):
    report = job_cost_report(job=job_with_fleet, as_of=h(10))
    assert len(report.segments) == 5
    assert report.total == sum(s.cost for s in report.segments)
    assert report.total == expected_total()
    assert report.billed_hours == Decimal("8.5")
    data = report.to_dict()
    assert data["total_usd"] == str(expected_total().quantize(Decimal("0.01")))
    assert data["billed_hours"] == "8.5000"


def test_breakdowns_by_type_and_zone(job_with_fleet):
    data = job_cost_report(job=job_with_fleet, as_of=h(10)).to_dict()
    by_type = {row["instance_type"]: row for row in data["by_instance_type"]}
    by_zone = {row["zone"]: row for row in data["by_zone"]}
    assert by_type.keys() == {"p3.2xlarge", "g4dn.xlarge"}
    assert by_type["p3.2xlarge"]["hours"] == "5.5000"
    assert by_type["g4dn.xlarge"]["cost_usd"] == str((Decimal("0.1578") + 2 * Decimal("0.17")).quantize(
        Decimal("0.01")))
    assert by_zone.keys() == {"use1-az4", "use1-az6"}
    assert by_zone["use1-az6"]["cost_usd"] == str((Decimal("2.5") * Decimal("0.95")).quantize(Decimal("0.01")))
    assert sum(Decimal(r["hours"]) for r in data["by_zone"]) == Decimal("8.5")


def test_on_demand_equivalent_and_savings(job_with_fleet):
    report = job_cost_report(job=job_with_fleet, as_of=h(10))
    on_demand = Decimal("5.5") * Decimal("3.06") + 3 * Decimal("0.526")
    assert report.on_demand_equivalent == on_demand
    assert report.savings == on_demand - expected_total()
    data = report.to_dict()
    assert data["savings_usd"] == str((on_demand - expected_total()).quantize(Decimal("0.01")))
    pct = ((on_demand - expected_total()) / on_demand * 100).quantize(Decimal("0.01"))
    assert data["savings_pct"] == str(pct)
    assert Decimal(data["savings_pct"]) > 50  # spot is cheap


def test_preemption_loss_uses_the_spend_rate_at_the_event(job_with_fleet):
    job = job_with_fleet
    # At h(2.75) the p3 in az4 (1.1/h) and the g4 (0.17/h) run: 1.27 USD/h. 900 s lost -> 0.3175 USD.
    Reconfiguration.objects.create(job=job, trigger="notice", trigger_key="n-1", strategy="recycle",
                                   decided_at=h(2.75), lost_seconds=900.0)
    # A join that lost nothing adds nothing.
    Reconfiguration.objects.create(job=job, trigger="join", trigger_key="j-1", strategy="recycle",
                                   decided_at=h(3.5), lost_seconds=0.0)
    report = job_cost_report(job=job, as_of=h(10))
    assert report.preemption_events == 1
    assert report.preemption_loss == Decimal("900") / 3600 * (Decimal("1.1") + Decimal("0.17"))
    assert report.to_dict()["preemption_loss_usd"] == "0.32"


def test_open_segment_is_costed_until_as_of():
    team = make_team()
    job = make_job(team)
    itype, zone = make_instance_type("g5.xlarge", "1.006"), make_zone()
    make_spot_prices(itype, zone, [(h(-1), "0.40")])
    billing_backfill(instance=make_instance(team, job=job, instance_type=itype, zone=zone, running_at=h(0),
                                            state="running"))
    report = job_cost_report(job=job, as_of=h(2.5))
    assert report.segments[0].end is None
    assert report.total == Decimal("0.40") * Decimal("2.5")


def test_csv_has_one_line_per_segment_and_a_total(job_with_fleet):
    report = job_cost_report(job=job_with_fleet, as_of=h(10))
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert len(rows) == len(report.segments) + 1
    assert rows[-1]["segment_id"] == "TOTAL"
    assert rows[-1]["cost_usd"] == report.to_dict()["total_usd"]
    assert sum(Decimal(r["cost_usd"]) for r in rows[:-1]) == sum(s.cost.quantize(Decimal("0.000001"))
                                                                  for s in report.segments)


def test_exact_hours_has_no_float_error():
    assert exact_hours(timedelta(hours=1, microseconds=1)) == Decimal(3600000001) / Decimal(3600000000)


# --- spot and on-demand capacity apart -------------------------------------------------------------


@pytest.fixture
def mixed_job():
    """One spot p3.2xlarge for 3 h across a price change, one on-demand p3.2xlarge for 2 h."""
    team = make_team()
    job = make_job(team, capacity="spot_then_on_demand")
    p3, az4 = make_instance_type("p3.2xlarge", "3.06"), make_zone("us-east-1a", "use1-az4")
    make_spot_prices(p3, az4, [(h(-1), "0.9180"), (h(1.5), "1.1000")])
    spot = make_instance(team, job=job, instance_type=p3, zone=az4, running_at=h(0), ended_at=h(3),
                         state="preempted")
    on_demand = make_instance(team, job=job, instance_type=p3, zone=az4, lifecycle="on_demand", running_at=h(2),
                              ended_at=h(4), state="terminated")
    for instance in (spot, on_demand):
        billing_backfill(instance=instance)
    return job


def test_capacity_types_add_up_to_the_totals(mixed_job):
    report = job_cost_report(job=mixed_job, as_of=h(10))
    spot, on_demand = report.by_capacity_type["spot"], report.by_capacity_type["on_demand"]
    assert spot.hours == Decimal(3) and spot.cost == Decimal("1.5") * Decimal("0.918") + Decimal("1.5") * Decimal("1.1")
    assert on_demand.hours == Decimal(2) and on_demand.cost == 2 * Decimal("3.06")  # priced on demand
    assert spot.hours + on_demand.hours == report.billed_hours
    assert spot.cost + on_demand.cost == report.total
    data = report.to_dict()
    assert data["by_capacity_type"] == {
        "spot": {"segments": 2, "hours": "3.0000", "cost_usd": str(spot.cost.quantize(Decimal("0.01")))},
        "on_demand": {"segments": 1, "hours": "2.0000", "cost_usd": "6.12"},
    }
    # The existing keys are unchanged: the on-demand equivalent still covers both types.
    assert data["on_demand_equivalent_usd"] == str((5 * Decimal("3.06")).quantize(Decimal("0.01")))


def test_a_spot_only_job_lists_on_demand_as_zero(job_with_fleet):
    data = job_cost_report(job=job_with_fleet, as_of=h(10)).to_dict()
    assert data["by_capacity_type"]["on_demand"] == {"segments": 0, "hours": "0.0000", "cost_usd": "0.00"}
    assert data["by_capacity_type"]["spot"]["hours"] == data["billed_hours"]
    assert data["by_capacity_type"]["spot"]["cost_usd"] == data["total_usd"]


def test_csv_splits_hours_and_cost_by_capacity_type(mixed_job):
    report = job_cost_report(job=mixed_job, as_of=h(10))
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    segments, total = rows[:-1], rows[-1]
    assert len(segments) == len(report.segments) == 3 and total["segment_id"] == "TOTAL"
    for row in segments:  # a segment fills its own type's columns only
        own, other = ("spot", "on_demand") if row["lifecycle"] == "spot" else ("on_demand", "spot")
        assert row[f"{own}_capacity_hours"] == row["hours"] and row[f"{own}_capacity_cost_usd"] == row["cost_usd"]
        assert row[f"{other}_capacity_hours"] == row[f"{other}_capacity_cost_usd"] == ""
    split = report.to_dict()["by_capacity_type"]
    for kind in ("spot", "on_demand"):
        assert total[f"{kind}_capacity_hours"] == split[kind]["hours"]
        assert total[f"{kind}_capacity_cost_usd"] == split[kind]["cost_usd"]
        assert sum(Decimal(r[f"{kind}_capacity_hours"] or 0) for r in segments) == Decimal(split[kind]["hours"])
    # Summing every non-TOTAL line still gives the total: the split is in columns, not extra lines.
    assert sum(Decimal(r["cost_usd"]) for r in segments).quantize(Decimal("0.01")) == Decimal(total["cost_usd"])


def test_cost_report_api_serves_the_split_in_json_and_csv(mixed_job):
    from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client

    client = token_client(make_api_token(mixed_job.team, user=make_api_user(mixed_job.team)))
    url = f"/api/v1/jobs/{mixed_job.pk}/cost-report/"
    data = client.get(url, {"as_of": h(10).isoformat()}).json()
    assert data["by_capacity_type"] == job_cost_report(job=mixed_job, as_of=h(10)).to_dict()["by_capacity_type"]
    rows = list(csv.DictReader(io.StringIO(client.get(url, {"format": "csv"}).content.decode())))
    assert rows[-1]["on_demand_capacity_cost_usd"] == "6.12"


def test_spotpipe_status_prints_the_policy_and_the_split(mixed_job, monkeypatch):
    from spotpipe import commands
    from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client

    TrainingJob.objects.filter(pk=mixed_job.pk).update(capacity_type="on_demand")  # the policy switched
    api = token_client(make_api_token(mixed_job.team, user=make_api_user(mixed_job.team)))

    class Served:  # spotpipe's client, answered by the API in-process
        def job(self, job_id: int) -> dict:
            return api.get(f"/api/v1/jobs/{job_id}/").json()

        def call(self, method: str, path: str) -> dict:
            return getattr(api, method.lower())(f"/api/v1/{path}").json()

    monkeypatch.setattr(commands, "_client", Served)
    out = io.StringIO()
    assert commands.status(mixed_job.pk, out=out) == 0
    printed = out.getvalue()
    assert "capacity spot_then_on_demand, on_demand now" in printed
    report = job_cost_report(job=mixed_job).to_dict()  # segments are closed: the same at any as_of
    spot = report["by_capacity_type"]["spot"]
    assert f"spot {spot['hours']} h ${spot['cost_usd']}" in printed
    assert "on-demand 2.0000 h $6.12" in printed
    assert f"total ${report['total_usd']}" in printed
    # Spend, budget and the projection at completion (issue 39): the ledger's figure, to the cent.
    spend = api.get(f"/api/v1/jobs/{mixed_job.pk}/").json()["spend"]
    assert spend["spent_usd"] == report["total_usd"]
    assert f"spend ${spend['spent_usd']} of ${mixed_job.budget_usd} budget" in printed
