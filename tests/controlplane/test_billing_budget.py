"""Budget thresholds: each crossing is recorded and alerted once."""

from __future__ import annotations

from decimal import Decimal

import pytest

from controlplane.jobs.budget import budgets_check, job_budget_check
from controlplane.jobs.models import JobEvent
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertDelivery
from tests.controlplane import test_billing_report
from tests.controlplane.test_billing_report import expected_total

pytestmark = pytest.mark.django_db
# The cost report's fleet: three instances with price changes mid-life (a pytest fixture).
job_with_fleet = test_billing_report.job_with_fleet


def test_crossings_are_recorded_and_alerted_once(job_with_fleet, settings):
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the alert URL is on loopback
    job = job_with_fleet
    alert_endpoint_create(team=job.team, url="http://127.0.0.1:9/hook", events=["budget.threshold"])
    job.budget_usd = (expected_total() / Decimal("0.98")).quantize(Decimal("0.01"))  # spend is 98% of it
    job.save(update_fields=["budget_usd"])

    assert job_budget_check(job=job) == [50, 80]
    assert job_budget_check(job=job) == []  # a second run (or a retried task) alerts nothing more
    assert budgets_check() == {}

    job.budget_usd = Decimal("5.00")  # now overspent
    job.save(update_fields=["budget_usd"])
    assert budgets_check() == {job.pk: [100]}

    events = JobEvent.objects.filter(job=job, kind="budget_threshold").order_by("id")
    assert [e.data["threshold_pct"] for e in events] == [50, 80, 100]
    deliveries = AlertDelivery.objects.filter(endpoint__team=job.team).order_by("id")
    assert [d.payload["data"]["threshold_pct"] for d in deliveries] == [50, 80, 100]


def test_a_job_without_budget_or_under_half_is_left_alone(job_with_fleet):
    job = job_with_fleet
    job.budget_usd = expected_total() * 3
    job.save(update_fields=["budget_usd"])
    assert job_budget_check(job=job) == []
    assert not JobEvent.objects.filter(job=job, kind="budget_threshold").exists()
