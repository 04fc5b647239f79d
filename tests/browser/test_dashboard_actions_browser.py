"""The page actions of issue 21 end to end in headless Chromium against a live server: an admin
terminates an instance from the fleet page (the button asks first, with an optional reason; a
fake provider stands in for the cloud) and retries a failed notice from the notices page. The
buttons come from the data endpoints and post with the page's CSRF token."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.accounts.models import Role
from controlplane.fleet.models import Instance, InstanceEvent, InterruptionNotice, NoticeStatus
from controlplane.orchestration.services import liveness  # instance_terminate looks get_provider up here
from frontend import browser
from tests.controlplane.factories import make_instance, make_team, make_user
from tests.orchestration.fakes import FakeProvider

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

PASSWORD = "correct-horse-battery-staple"  # what tests.controlplane.factories.make_user sets


@pytest.fixture
def world(chromium):
    team = make_team("alpha")
    admin = make_user(team, role=Role.ADMIN, username="alice")
    instance = make_instance(team, state="running", running_at=timezone.now(), provider_instance_id="i-0browser")
    return team, admin, instance


def test_terminate_an_instance_from_the_fleet_page(page, live_server, world, monkeypatch):
    provider = FakeProvider()
    monkeypatch.setattr(liveness, "get_provider", lambda kind: provider)
    _, admin, instance = world
    browser.login(page, live_server.url, admin.username, PASSWORD)
    page.goto(live_server.url + "/fleet/")
    browser.wait_loaded(page)
    button = page.get_by_role("button", name="Terminate i-0browser")
    # Cancelling the question sends nothing.
    page.once("dialog", lambda dialog: dialog.dismiss())
    button.click()
    assert page.url == live_server.url + "/fleet/"
    assert Instance.objects.get(pk=instance.pk).state == "running" and provider.terminated == []
    questions: list[str] = []

    def answer(dialog):
        questions.append(dialog.message)
        dialog.accept("stuck GPU")

    page.once("dialog", answer)
    with page.expect_navigation():
        button.click()
    browser.wait_loaded(page)
    assert "Terminate i-0browser now?" in questions[0]
    assert page.locator(".messages").inner_text().strip() == "i-0browser terminated."
    assert page.locator("#table-live").inner_text().strip() == "No live instances."
    assert Instance.objects.get(pk=instance.pk).state == "terminated" and provider.terminated == ["i-0browser"]
    event = InstanceEvent.objects.get(instance=instance, to_state="terminated")
    assert event.detail["reason"] == "stuck GPU"


def test_retry_a_failed_notice_from_the_notices_page(page, live_server, world, settings):
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"  # no worker here: the row going back to received is the check
    team, admin, instance = world
    notice = InterruptionNotice.objects.create(
        team=team, source="aws_eventbridge", kind="interruption", action="terminate", dedup_key="browser-1",
        cloud_event_id="browser-event-1", provider_instance_id=instance.provider_instance_id, instance=instance,
        received_at=timezone.now(), status=NoticeStatus.FAILED, attempts=5, error="boom",
    )
    browser.login(page, live_server.url, admin.username, PASSWORD)
    page.goto(live_server.url + "/notices/")
    browser.wait_loaded(page)
    with page.expect_navigation():
        page.get_by_role("button", name=f"Retry notice {notice.pk}").click()
    browser.wait_loaded(page)
    assert page.locator(".messages").inner_text().strip() == (
        f"Notice {notice.pk} (i-0browser) will be processed again.")
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.RECEIVED and notice.attempts == 0
    # Received, not failed: the row offers no retry any more.
    assert page.get_by_role("button", name=f"Retry notice {notice.pk}").count() == 0
