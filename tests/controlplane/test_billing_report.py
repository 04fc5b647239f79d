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
from controlplane.jobs.models import Reconfiguration
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
