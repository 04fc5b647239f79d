"""The job page of a long job stays short: 1,000 events, 30 generations and 30 reconfigurations fit
in under two screens; the timeline pages through the events newest first and filters them by kind;
earlier generations are one line each with what changed (issue 21, "Dashboard")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.accounts.models import Role
from controlplane.jobs.models import JobEvent, JobGeneration, Reconfiguration
from frontend import browser
from frontend.selectors import EVENTS_PER_PAGE
from spotpipe.demo import history as demo_history
from tests.controlplane.factories import make_team, make_user

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PASSWORD = "correct-horse-battery-staple"  # what tests.controlplane.factories.make_user sets
VIEWPORT = {"width": 1280, "height": 900}
KINDS = ("agent_step", "agent_heartbeat_gap", "node_acquired", "notice", "agent_worker_exit")
EVENTS = 1000
EXTRA_GENERATIONS = 27  # the demo job has 3


@pytest.fixture
def long_job(chromium):
    now = timezone.now()
    pools = demo_history.ensure_market(pools=2)
    team = make_team("alpha")
    user = make_user(team, role=Role.ADMIN, username="alice")
    job = demo_history.seed_team_activity(team=team, user=user, pools=pools, now=now, metric_steps=300)["running"]
    start = now - timedelta(hours=5)
    JobEvent.objects.bulk_create([
        JobEvent(job=job, kind=KINDS[i % len(KINDS)], message=f"event number {i}", at=start + timedelta(seconds=10 * i))
        for i in range(EVENTS)
    ])
    last = JobGeneration.objects.get(job=job, number=3)
    members = list(last.membership)
    for k in range(EXTRA_GENERATIONS):
        number = 4 + k
        # Every other generation drops the last member, the next one takes it back.
        membership = members[:-1] if k % 2 == 0 else members
        JobGeneration.objects.create(job=job, number=number, membership=membership, layout=last.layout,
                                     reason=f"change {number}", created_at=now - timedelta(minutes=60 - k))
        Reconfiguration.objects.create(job=job, trigger="preemption", trigger_key=f"test-{number}",
                                       decision="reroute", status="applied",
                                       from_generation=number - 1, to_generation=number,
                                       decided_at=now - timedelta(minutes=60 - k), lost_seconds=3.0)
    job.current_generation = 3 + EXTRA_GENERATIONS
    job.save(update_fields=["current_generation"])
    return job


@pytest.fixture
def tab(chromium):
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(browser.DEFAULT_TIMEOUT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def _rows(tab) -> list[list[str]]:
    return tab.evaluate("Array.from(document.querySelectorAll('#table-events tbody tr'))"
                        ".map(tr => Array.from(tr.cells).map(td => td.textContent))")


def test_a_job_with_1000_events_fits_in_two_screens(tab, live_server, long_job):
    browser.login(tab, live_server.url, "alice", PASSWORD)
    tab.goto(f"{live_server.url}/jobs/{long_job.pk}/")
    browser.wait_loaded(tab)
    tab.wait_for_selector("#table-events tbody tr")
    height = tab.evaluate("document.documentElement.scrollHeight")
    assert height < 2 * VIEWPORT["height"], f"the job page is {height} px tall"

    total = JobEvent.objects.filter(job=long_job).count()
    pages = -(-total // EVENTS_PER_PAGE)
    rows = _rows(tab)
    assert len(rows) == EVENTS_PER_PAGE
    assert rows[0][2] == f"event number {EVENTS - 1}"  # newest first
    assert tab.locator("#events-pager").inner_text().startswith(f"· page 1 of {pages}")
    assert tab.locator("#events-newer").is_disabled()

    # One generation drawn in full (the current one), every earlier one a line saying what changed.
    assert tab.locator(".generation").count() == 1
    assert f"Generation {3 + EXTRA_GENERATIONS} (current)" in tab.locator(".generation figcaption").inner_text()
    lines = tab.locator(".generation-line")
    assert lines.count() == 2 + EXTRA_GENERATIONS
    # Newest first; the seeding alternates a node leaving and joining again.
    assert lines.nth(0).get_attribute("data-generation") == str(2 + EXTRA_GENERATIONS)
    assert "joined:" in lines.nth(0).get_attribute("title") and "left:" in lines.nth(1).get_attribute("title")
    assert tab.locator(".generation-more").get_attribute("open") is None  # the rest closed

    # Older pages, then back.
    tab.locator("#events-older").click()
    tab.wait_for_function("document.getElementById('events-pager').textContent.startsWith('· page 2 ')")
    assert _rows(tab)[0][2] == f"event number {EVENTS - 1 - EVENTS_PER_PAGE}"
    tab.locator("#events-newer").click()
    tab.wait_for_function("document.getElementById('events-pager').textContent.startsWith('· page 1 ')")

    # Filter by kind: every row of that kind, the count of that kind, paging within it.
    notices = JobEvent.objects.filter(job=long_job, kind="notice").count()
    tab.select_option("#events-kind", "notice")
    tab.wait_for_function(f"document.getElementById('events-pager').textContent.includes('{notices} event(s)')")
    assert {row[1] for row in _rows(tab)} == {"notice"}
    tab.locator("#events-older").click()
    tab.wait_for_function("document.getElementById('events-pager').textContent.startsWith('· page 2 ')")
    assert {row[1] for row in _rows(tab)} == {"notice"}
    assert tab.evaluate("document.documentElement.scrollHeight") < 2 * VIEWPORT["height"]
