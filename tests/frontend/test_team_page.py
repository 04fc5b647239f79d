"""The team page: members see it, admins manage members, tokens and alert URLs, members cannot,
and another team's page is a 404."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.accounts.models import ApiToken, Membership, Role
from controlplane.webhooks.models import AlertEndpoint
from tests.controlplane.factories import make_team, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams():
    alpha, beta = make_team("alpha"), make_team("beta")
    admin = make_user(alpha, role=Role.ADMIN, username="ada")
    member = make_user(alpha, username="max")
    make_user(beta, role=Role.ADMIN, username="bea")
    return alpha, beta, admin, member


def test_a_single_team_user_lands_on_their_team(client, teams):
    alpha, _, admin, _ = teams
    client.force_login(admin)
    response = client.get(reverse("frontend:team-list"))
    assert response.status_code == 302 and response["Location"] == reverse("frontend:team", args=[alpha.slug])
    page = client.get(response["Location"]).content.decode()
    assert "ada" in page and "max" in page and "Add alert URL" in page


def test_admin_adds_a_member_creates_and_revokes_a_token_and_adds_an_alert_url(client, teams):
    alpha, _, admin, _ = teams
    newcomer = make_user(None, username="newcomer")
    client.force_login(admin)
    client.post(reverse("frontend:team-member-add", args=[alpha.slug]), {"username": "newcomer", "role": "member"})
    assert Membership.objects.filter(team=alpha, user=newcomer, role=Role.MEMBER).exists()
    page = client.post(reverse("frontend:team-token-create", args=[alpha.slug]), {"name": "ci"}, follow=True)
    token = ApiToken.objects.get(team=alpha, name="ci")
    assert "not shown again" in page.content.decode()
    # The key shown once authenticates against the API.
    key = page.content.decode().split('id="revealed-secret">')[1].split("<")[0].strip()
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    client.post(reverse("frontend:team-token-revoke", args=[alpha.slug, token.pk]))
    token.refresh_from_db()
    assert token.revoked_at is not None
    client.post(reverse("frontend:team-alert-add", args=[alpha.slug]), {"url": "https://hooks.example.com/x",
                                                                         "format": "slack"})
    assert AlertEndpoint.objects.filter(team=alpha, url="https://hooks.example.com/x", format="slack").exists()
    bad = client.post(reverse("frontend:team-alert-add", args=[alpha.slug]), {"url": "ftp://x"}, follow=True)
    assert "url must be http(s)" in bad.content.decode()
    client.post(reverse("frontend:team-member-remove", args=[alpha.slug, newcomer.pk]))
    assert not Membership.objects.filter(team=alpha, user=newcomer).exists()


def test_a_nul_in_a_form_is_a_message_and_stores_nothing(client, teams):
    """PostgreSQL refuses U+0000 (a 500 there; SQLite stored it): each form says so instead."""
    alpha, _, admin, _ = teams
    client.force_login(admin)
    tokens, endpoints = ApiToken.objects.count(), AlertEndpoint.objects.count()
    for name, data, words in [
        ("team-member-add", {"username": "new\x00comer", "role": "member"}, "no user named"),
        ("team-token-create", {"name": "c\x00i"}, "name contains a NUL character"),
        ("team-alert-add", {"url": "https://hooks.example.com/\x00", "format": "slack"}, "url contains a NUL"),
    ]:
        page = client.post(reverse(f"frontend:{name}", args=[alpha.slug]), data, follow=True)
        assert page.status_code == 200 and words in page.content.decode(), name
    assert (ApiToken.objects.count(), AlertEndpoint.objects.count()) == (tokens, endpoints)


def test_a_member_sees_the_team_but_cannot_change_it(client, teams):
    alpha, _, _, member = teams
    client.force_login(member)
    page = client.get(reverse("frontend:team", args=[alpha.slug])).content.decode()
    assert "its admins manage" in page and "Add alert URL" not in page
    for name, args, data in [("team-member-add", [], {"username": "max", "role": "admin"}),
                             ("team-member-role", [member.pk], {"role": "admin"}),
                             ("team-member-remove", [member.pk], {}),
                             ("team-token-create", [], {"name": "x"}),
                             ("team-token-revoke", [1], {}),
                             ("team-alert-add", [], {"url": "https://x.example"})]:
        url = reverse(f"frontend:{name}", args=[alpha.slug, *args])
        assert client.post(url, data).status_code == 403
        assert client.get(url).status_code == 405  # POST only, for admins and members alike
    assert Membership.objects.get(team=alpha, user=member).role == Role.MEMBER
    assert not AlertEndpoint.objects.exists() and not ApiToken.objects.exists()


def test_another_teams_page_and_actions_are_not_found(client, teams):
    _, beta, admin, _ = teams
    client.force_login(admin)
    assert client.get(reverse("frontend:team", args=[beta.slug])).status_code == 404
    for name in ("team-member-add", "team-token-create", "team-alert-add"):
        assert client.post(reverse(f"frontend:{name}", args=[beta.slug]), {"username": "ada"}).status_code == 404
    assert not Membership.objects.filter(team=beta, user=admin).exists()


def test_the_last_admin_cannot_be_removed(client, teams):
    alpha, _, admin, _ = teams
    client.force_login(admin)
    page = client.post(reverse("frontend:team-member-remove", args=[alpha.slug, admin.pk]), follow=True)
    assert "last admin" in page.content.decode()
    assert Membership.objects.filter(team=alpha, user=admin).exists()


def test_the_team_page_shows_its_quota_and_queue(client, teams):
    from controlplane.accounts.models import TeamQuota
    from tests.controlplane.factories import make_job

    alpha, _, admin, _ = teams
    TeamQuota.objects.create(team=alpha, max_jobs=1)
    make_job(alpha)
    waiting = make_job(alpha)
    client.force_login(admin)
    page = client.get(reverse("frontend:team", args=[alpha.slug])).content.decode()
    assert "Quota and queue" in page and "jobs 1 of 1" in page
    assert f"#{waiting.pk}</a>" in page and "max_jobs is 1" in page
