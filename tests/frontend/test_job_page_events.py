"""The job page's data: one page of events (newest first), filtered by kind; each generation with
what changed from the one before; bad paging parameters answer 400 naming them (issue 21)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.accounts.models import Role
from controlplane.jobs.models import JobEvent, JobGeneration
from frontend.selectors import EVENTS_PER_PAGE, job_events_page, job_layouts
from tests.controlplane.factories import make_instance, make_job, make_team, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    team = make_team("alpha")
    job = make_job(team)
    now = timezone.now()
    JobEvent.objects.filter(job=job).delete()  # only these 1,000
    JobEvent.objects.bulk_create([
        JobEvent(job=job, kind="step" if i % 4 else "notice", message=f"event {i}",
                 at=now - timedelta(seconds=1000 - i))
        for i in range(1000)
    ])
    return job


def test_pages_newest_first_and_the_last_page_is_partial(job):
    first = job_events_page(job=job)
    assert first["count"] == 1000 and first["pages"] == -(-1000 // EVENTS_PER_PAGE) and first["page"] == 1
    assert [r["message"] for r in first["rows"]] == [f"event {999 - i}" for i in range(EVENTS_PER_PAGE)]
    assert first["kinds"] == [{"kind": "notice", "count": 250}, {"kind": "step", "count": 750}]
    second = job_events_page(job=job, page=2)
    assert second["rows"][0]["message"] == f"event {999 - EVENTS_PER_PAGE}"
    past = job_events_page(job=job, page=10_000)  # past the end: the last page
    assert past["page"] == first["pages"] and past["rows"][-1]["message"] == "event 0"


def test_filter_by_kind(job):
    notices = job_events_page(job=job, kind="notice", page=3)
    assert notices["count"] == 250 and notices["kind"] == "notice"
    assert {r["kind"] for r in notices["rows"]} == {"notice"}
    assert notices["rows"][0]["message"] == f"event {996 - 4 * 2 * EVENTS_PER_PAGE}"
    none = job_events_page(job=job, kind="no-such-kind")
    assert none["count"] == 0 and none["rows"] == [] and none["page"] == 1 and none["pages"] == 1


def test_each_generation_says_what_changed():
    team = make_team("beta")
    job = make_job(team, current_generation=3)
    a, b, c = (make_instance(team, job=job) for _ in range(3))
    member = lambda i, p, s: {"instance": i.pk, "pipeline": p, "stage": s}  # noqa: E731
    layout = {"dp": 1, "pp": 2, "stage_layers": [2, 2]}
    JobGeneration.objects.create(job=job, number=1, membership=[member(a, 0, 0), member(b, 0, 1)], layout=layout,
                                 created_at=timezone.now())
    JobGeneration.objects.create(job=job, number=2, created_at=timezone.now(),
                                 membership=[member(a, 0, 0), member(c, 0, 1)],
                                 layout={**layout, "reroutes": [{"from": b.pk, "to": c.pk}]})
    JobGeneration.objects.create(job=job, number=3, membership=[member(c, 0, 0)], created_at=timezone.now(),
                                 layout={"dp": 1, "pp": 1, "stage_layers": [4]})
    first, second, third = job_layouts(job=job)
    label = {cell["instance"]: cell["label"] for g in (first, second, third) for cell in g["cells"]}
    assert first["changes"] == ["2 node(s), dp=1 x pp=2"]
    assert second["changes"] == [f"left: {label[b.pk]}", f"joined: {label[c.pk]}",
                                 "1 re-route(s)"]
    assert third["changes"] == ["pp 2→1", "layers per stage [2, 2]→[4]", f"left: {label[a.pk]}",
                                "1 node(s) moved stage"]
    assert third["current"] and not second["current"]


@pytest.mark.parametrize("params, field", [
    ({"events_page": "0"}, "events_page"),
    ({"events_page": "two"}, "events_page"),
    ({"events_page": "²"}, "events_page"),
    ({"events_kind": "x" * 41}, "events_kind"),
])
def test_bad_paging_is_400_naming_the_parameter(client, job, params, field):
    user = make_user(job.team, role=Role.MEMBER, username="carol")
    client.force_login(user)
    response = client.get(f"/data/jobs/{job.pk}.json", params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_the_data_endpoint_pages_and_filters(client, job):
    client.force_login(make_user(job.team, role=Role.MEMBER, username="dave"))
    data = client.get(f"/data/jobs/{job.pk}.json", {"events_page": "2", "events_kind": "step"}).json()
    assert data["events"]["page"] == 2 and data["events"]["kind"] == "step"
    assert {r["kind"] for r in data["events"]["rows"]} == {"step"}
    other = make_job(make_team("gamma"))
    assert client.get(f"/data/jobs/{other.pk}.json", {"events_page": "2"}).status_code == 404


def test_the_job_page_shows_spend_budget_and_end_reason(client):
    from decimal import Decimal

    from django.urls import reverse

    team = make_team()
    user = make_user(team, role=Role.ADMIN)
    job = make_job(team, budget_usd=Decimal("12.50"), status="stopped")
    type(job).objects.filter(pk=job.pk).update(end_reason="budget")
    client.force_login(user)
    page = client.get(reverse("frontend:job-detail", args=[job.pk])).content.decode()
    assert 'id="job-spend"' in page and "of a $12.50 budget" in page
    assert 'id="job-end-reason">budget<' in page and "Resume job" in page
