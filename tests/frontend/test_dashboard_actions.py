"""The operator actions the API gained, on the dashboard's pages (issue 21, "API completeness"):
terminate an instance (fleet), retry a failed notice (notices), change a member's role and
download the team's spend report (team page). Each calls the API's service; team admins only
(a member's POST is 403), another team's object 404, and a service's refusal is a message on the
page, never a 500. (Rotating one's token, whose key is a secret, is in test_team_secrets.py.)"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from controlplane.accounts.models import Membership, Role
from controlplane.billing.models import BillingSegment, PriceSource
from controlplane.fleet.models import Instance, InstanceEvent, InterruptionNotice, NoticeStatus
from controlplane.orchestration.services import liveness  # instance_terminate looks get_provider up here
from tests.controlplane.api_helpers import make_api_token
from tests.controlplane.factories import make_instance, make_job, make_team, make_user
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(monkeypatch):
    fake = FakeProvider()
    monkeypatch.setattr(liveness, "get_provider", lambda kind: fake)
    return fake


@pytest.fixture
def world():
    alpha, beta = make_team("alpha"), make_team("beta")
    admin = make_user(alpha, role=Role.ADMIN, username="ada")
    member = make_user(alpha, username="max")
    make_user(beta, role=Role.ADMIN, username="bea")
    job = make_job(alpha, name="train-a")
    now = timezone.now()
    instance = make_instance(alpha, job=job, state="running", running_at=now, provider_instance_id="i-alpha-1")
    other = make_instance(beta, state="running", running_at=now, provider_instance_id="i-beta-1")
    return {"alpha": alpha, "beta": beta, "admin": admin, "member": member, "job": job, "instance": instance,
            "other_instance": other}


def _notice(team, *, status: str, n: int = 1) -> InterruptionNotice:
    return InterruptionNotice.objects.create(
        team=team, source="aws_eventbridge", kind="interruption", action="terminate", dedup_key=f"{team.slug}-{n}",
        cloud_event_id=f"{team.slug}-event-{n}", provider_instance_id=f"i-{team.slug}-{n}",
        received_at=timezone.now(), status=status, attempts=5 if status == NoticeStatus.FAILED else 1,
        error="boom" if status == NoticeStatus.FAILED else "",
    )


def _messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- terminate an instance ----------------------------------------------------------------------


def test_an_admin_terminates_an_instance_from_the_fleet_page(client, world, provider):
    instance = world["instance"]
    client.force_login(world["admin"])
    live = client.get(reverse("frontend:fleet-data")).json()["live_instances"]
    url = reverse("frontend:instance-terminate", args=[instance.pk])
    assert {row["id"]: row["terminate_url"] for row in live} == {instance.pk: url}
    response = client.post(url, {"reason": "stuck GPU"}, follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == reverse("frontend:fleet")
    assert _messages(response) == ["i-alpha-1 terminated."]
    instance.refresh_from_db()
    assert instance.state == "terminated" and provider.terminated == ["i-alpha-1"]
    event = InstanceEvent.objects.filter(instance=instance, to_state="terminated").get()
    assert event.detail["reason"] == "stuck GPU"
    # No longer live: no row, no button.
    assert client.get(reverse("frontend:fleet-data")).json()["live_instances"] == []


def test_a_member_has_no_terminate_button_and_is_refused(client, world, provider):
    instance = world["instance"]
    client.force_login(world["member"])
    live = client.get(reverse("frontend:fleet-data")).json()["live_instances"]
    assert [row["terminate_url"] for row in live] == [None]
    response = client.post(reverse("frontend:instance-terminate", args=[instance.pk]), {"reason": "x"})
    assert response.status_code == 403
    instance.refresh_from_db()
    assert instance.state == "running" and provider.terminated == []


def test_another_teams_instance_is_not_found(client, world, provider):
    client.force_login(world["admin"])
    response = client.post(reverse("frontend:instance-terminate", args=[world["other_instance"].pk]), {})
    assert response.status_code == 404
    assert Instance.objects.get(pk=world["other_instance"].pk).state == "running" and provider.terminated == []


def test_a_refusing_provider_is_a_message_and_nothing_changes(client, world, monkeypatch):
    monkeypatch.setattr(liveness, "get_provider", lambda kind: FakeProvider(refuse_terminate=True))
    client.force_login(world["admin"])
    response = client.post(reverse("frontend:instance-terminate", args=[world["instance"].pk]), {}, follow=True)
    assert response.status_code == 200
    [message] = _messages(response)
    assert "did not terminate i-alpha-1" in message and "UnauthorizedOperation" in message
    assert Instance.objects.get(pk=world["instance"].pk).state == "running"


def test_an_ended_instance_and_a_bad_reason_are_messages(client, world, provider):
    client.force_login(world["admin"])
    url = reverse("frontend:instance-terminate", args=[world["instance"].pk])
    too_long = client.post(url, {"reason": "x" * 201}, follow=True)
    assert _messages(too_long) == ["reason: Ensure this field has no more than 200 characters."]
    assert Instance.objects.get(pk=world["instance"].pk).state == "running" and provider.terminated == []
    assert _messages(client.post(url, {}, follow=True)) == ["i-alpha-1 terminated."]
    again = client.post(url, {}, follow=True)
    assert again.status_code == 200 and _messages(again) == [f"instance {world['instance'].pk} is already terminated"]
    assert client.get(url).status_code == 405  # POST only


# --- retry a failed notice ----------------------------------------------------------------------


def test_an_admin_retries_a_failed_notice(client, world):
    failed, processed = _notice(world["alpha"], status=NoticeStatus.FAILED), _notice(world["alpha"],
                                                                                      status="processed", n=2)
    client.force_login(world["admin"])
    rows = client.get(reverse("frontend:notices-data")).json()["rows"]
    url = reverse("frontend:notice-retry", args=[failed.pk])
    assert {row["id"]: row["retry_url"] for row in rows} == {failed.pk: url, processed.pk: None}
    response = client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == reverse("frontend:notices")
    assert _messages(response) == [f"Notice {failed.pk} (i-alpha-1) will be processed again."]
    failed.refresh_from_db()
    assert failed.status == NoticeStatus.RECEIVED and failed.attempts == 0


def test_retrying_a_notice_that_is_not_failed_is_a_message(client, world):
    processed = _notice(world["alpha"], status=NoticeStatus.PROCESSED)
    client.force_login(world["admin"])
    response = client.post(reverse("frontend:notice-retry", args=[processed.pk]), follow=True)
    assert response.status_code == 200
    assert _messages(response) == [f"notice {processed.pk} is processed; only a failed notice is retried"]
    assert InterruptionNotice.objects.get(pk=processed.pk).status == NoticeStatus.PROCESSED


def test_a_member_cannot_retry_and_another_teams_notice_is_not_found(client, world):
    ours, theirs = _notice(world["alpha"], status=NoticeStatus.FAILED), _notice(world["beta"], status="failed")
    client.force_login(world["member"])
    assert [row["retry_url"] for row in client.get(reverse("frontend:notices-data")).json()["rows"]] == [None]
    assert client.post(reverse("frontend:notice-retry", args=[ours.pk])).status_code == 403
    client.force_login(world["admin"])
    assert client.post(reverse("frontend:notice-retry", args=[theirs.pk])).status_code == 404
    assert set(InterruptionNotice.objects.values_list("status", flat=True)) == {NoticeStatus.FAILED}


# --- change a member's role ---------------------------------------------------------------------


def test_an_admin_promotes_and_demotes_a_member(client, world):
    alpha, admin, member = world["alpha"], world["admin"], world["member"]
    client.force_login(admin)
    page = client.get(reverse("frontend:team", args=[alpha.slug])).content.decode()
    assert reverse("frontend:team-member-role", args=[alpha.slug, member.pk]) in page
    url = reverse("frontend:team-member-role", args=[alpha.slug, member.pk])
    response = client.post(url, {"role": "admin"}, follow=True)
    assert _messages(response) == ["max is now admin of Alpha."]
    assert Membership.objects.get(team=alpha, user=member).role == Role.ADMIN
    # Two admins now: ada may step down.
    client.post(reverse("frontend:team-member-role", args=[alpha.slug, admin.pk]), {"role": "member"})
    assert Membership.objects.get(team=alpha, user=admin).role == Role.MEMBER


def test_the_last_admin_cannot_be_demoted_and_a_bad_role_is_named(client, world):
    alpha, admin = world["alpha"], world["admin"]
    client.force_login(admin)
    url = reverse("frontend:team-member-role", args=[alpha.slug, admin.pk])
    response = client.post(url, {"role": "member"}, follow=True)
    assert response.status_code == 200
    assert _messages(response) == ["ada is the last admin of alpha; add another admin first"]
    assert Membership.objects.get(team=alpha, user=admin).role == Role.ADMIN
    bad = client.post(reverse("frontend:team-member-role", args=[alpha.slug, world["member"].pk]),
                      {"role": "owner"}, follow=True)
    assert _messages(bad) == ["unknown role 'owner'; expected one of member, admin"]
    assert Membership.objects.get(team=alpha, user=world["member"]).role == Role.MEMBER


def test_a_member_cannot_change_roles_and_another_team_is_not_found(client, world):
    alpha, beta, member = world["alpha"], world["beta"], world["member"]
    client.force_login(member)
    page = client.get(reverse("frontend:team", args=[alpha.slug])).content.decode()
    assert "Change role" not in page
    assert client.post(reverse("frontend:team-member-role", args=[alpha.slug, member.pk]),
                       {"role": "admin"}).status_code == 403
    assert Membership.objects.get(team=alpha, user=member).role == Role.MEMBER
    client.force_login(world["admin"])
    bea = Membership.objects.get(team=beta).user
    assert client.post(reverse("frontend:team-member-role", args=[beta.slug, bea.pk]),
                       {"role": "member"}).status_code == 404
    # Someone who is not a member of the admin's own team: 404 too, and no membership is made.
    assert client.post(reverse("frontend:team-member-role", args=[alpha.slug, bea.pk]),
                       {"role": "member"}).status_code == 404
    assert not Membership.objects.filter(team=alpha, user=bea).exists()


# --- the team's spend report ----------------------------------------------------------------------


@pytest.fixture
def billed(world):
    """Two closed segments in this month, so every answer is the same whenever it is asked."""
    today = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    first = today.replace(day=1)
    for start in (first, today):
        BillingSegment.objects.create(instance=world["instance"], team=world["alpha"], job=world["job"],
                                      start=start, end=start + timedelta(minutes=30), price_per_hour=Decimal("1.2"),
                                      on_demand_price_per_hour=Decimal("3.06"), price_source=PriceSource.SPOT)
    return first.date(), today.date()


def test_the_spend_downloads_are_the_apis_report_for_this_month(client, world, billed):
    first, today = billed
    alpha = world["alpha"]
    client.force_login(world["member"])  # every member may read it
    page = client.get(reverse("frontend:team", args=[alpha.slug])).content.decode()
    assert reverse("frontend:team-spend-csv", args=[alpha.slug]) in page
    assert reverse("frontend:team-spend-json", args=[alpha.slug]) in page
    key = make_api_token(alpha, user=world["member"])
    api = f"/api/v1/teams/{alpha.pk}/spend/?start={first}&end={today}"
    csv_download = client.get(reverse("frontend:team-spend-csv", args=[alpha.slug]))
    assert csv_download.status_code == 200 and csv_download["Content-Type"].startswith("text/csv")
    assert csv_download["Content-Disposition"] == f'attachment; filename="team-alpha-spend-{first}-{today}.csv"'
    api_csv = client.get(api + "&format=csv", HTTP_AUTHORIZATION=f"Token {key}")
    assert csv_download.content.decode() == api_csv.content.decode()
    rows = list(csv.reader(io.StringIO(csv_download.content.decode())))
    assert rows[-1] == ["TOTAL", "", "", "1.0000", "1.20", "3.06"]
    mine = client.get(reverse("frontend:team-spend-json", args=[alpha.slug])).json()
    theirs = client.get(api, HTTP_AUTHORIZATION=f"Token {key}").json()
    assert {k: v for k, v in mine.items() if k != "as_of"} == {k: v for k, v in theirs.items() if k != "as_of"}
    assert mine["start"] == datetime.combine(first, datetime.min.time(), tzinfo=UTC).isoformat()
    assert mine["total_usd"] == "1.20" and len(mine["by_day"]) == (today - first).days + 1


def test_a_chosen_window_and_bad_windows(client, world, billed):
    first, today = billed
    alpha = world["alpha"]
    client.force_login(world["admin"])
    url = reverse("frontend:team-spend-json", args=[alpha.slug])
    one_day = client.get(url, {"start": str(today), "end": str(today)}).json()
    # On the first of a month both of the fixture's segments are today's (it failed on 2026-12-01).
    todays = "1.20" if first == today else "0.60"
    assert one_day["total_usd"] == todays and [d["day"] for d in one_day["by_day"]] == [str(today)]
    bad = client.get(url, {"start": "yesterday"})
    assert bad.status_code == 400 and bad.json()["detail"] == "start: Enter a valid date."
    backwards = client.get(url, {"start": "2026-03-02", "end": "2026-03-01"})
    assert backwards.status_code == 400 and "end (2026-03-01) must not be before start" in backwards.json()["detail"]
    too_long = client.get(url, {"start": "2024-01-01", "end": "2026-01-01"})
    assert too_long.status_code == 400 and too_long.json()["errors"] == {"end": ["at most 366 days from start"]}


def test_another_teams_spend_is_not_found_and_anonymous_is_401(client, world, billed):
    client.force_login(world["admin"])
    for name in ("frontend:team-spend-csv", "frontend:team-spend-json"):
        assert client.get(reverse(name, args=[world["beta"].slug])).status_code == 404
    client.logout()
    assert client.get(reverse("frontend:team-spend-csv", args=[world["alpha"].slug])).status_code == 401
