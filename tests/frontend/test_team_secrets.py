"""Secrets made on the team page (issue 21): a new API key (created, or rotated by its own user) and
an alert's signing secret (and its URL, which may hold a secret of its own) are shown once in the
response page itself, never in Django's messages, whose default storage is a cookie (then the
session), nor in a cache."""

from __future__ import annotations

import pytest
from django.contrib.messages.storage.cookie import CookieStorage
from django.test import RequestFactory
from django.urls import reverse

from controlplane.accounts.models import ApiToken, Role
from controlplane.accounts.services import api_token_create, api_token_revoke
from controlplane.webhooks.models import AlertEndpoint
from tests.controlplane.factories import make_team, make_user

pytestmark = pytest.mark.django_db

SLACK_URL = "https://hooks.slack.com/services/T0000/B0000/XyZsecretPart"


@pytest.fixture
def admin_client(client):
    team = make_team("alpha")
    client.force_login(make_user(team, role=Role.ADMIN, username="ada"))
    return client, team


def _readable(value: str) -> str:
    """A cookie's value as anyone holding it can read it: the messages cookie is signed and
    compressed, not encrypted."""
    decoded = CookieStorage(RequestFactory().get("/"))._decode(value)
    return value if decoded is None else value + " ".join(str(m) for m in decoded)


def _stored_anywhere(client, response, secret: str) -> list[str]:
    """Where `secret` sits outside the page: a cookie of the response or the client, the session."""
    places = [f"cookie {name}" for name, morsel in response.cookies.items() if secret in _readable(morsel.value)]
    places += [f"client cookie {name}" for name, morsel in client.cookies.items()
               if secret in _readable(morsel.value)]
    session = client.session
    places += [f"session {key}" for key, value in session.items() if secret in str(value)]
    return places


def test_a_new_api_key_is_shown_in_the_page_and_kept_nowhere(admin_client):
    client, team = admin_client
    response = client.post(reverse("frontend:team-token-create", args=[team.slug]), {"name": "ci"})
    assert _stored_anywhere(client, response, "sp_") == []  # every key starts so
    assert response.status_code == 200
    page = response.content.decode()
    key = page.split('id="revealed-secret">')[1].split("<")[0]
    assert key.startswith("sp_")
    assert response["Cache-Control"] == "no-store"
    # Shown once: the next visit does not show it.
    assert key not in client.get(reverse("frontend:team", args=[team.slug])).content.decode()


def test_an_alert_secret_and_its_url_are_shown_in_the_page_and_kept_nowhere(admin_client, monkeypatch):
    from controlplane.webhooks import egress

    monkeypatch.setattr(egress, "resolve", lambda host, port=None: ["52.89.214.238"])  # a public address
    client, team = admin_client
    response = client.post(reverse("frontend:team-alert-add", args=[team.slug]), {"url": SLACK_URL,
                                                                                  "format": "slack"})
    secret = AlertEndpoint.objects.get(team=team).signing_secret
    assert _stored_anywhere(client, response, secret) == []
    assert _stored_anywhere(client, response, "XyZsecretPart") == []
    assert response.status_code == 200
    assert secret in response.content.decode() and response["Cache-Control"] == "no-store"


def _key_in(page: str) -> str:
    return page.split('id="revealed-secret">')[1].split("<")[0]


def test_a_rotated_key_is_shown_in_the_page_and_kept_nowhere(client):
    """Any member rotates their own token (the API's POST /tokens/{id}/rotate/): the old one is
    revoked at once, the new key is shown once in the answer to the POST."""
    team = make_team("alpha")
    make_user(team, role=Role.ADMIN, username="ada")
    member = make_user(team, username="max")
    old, old_key = api_token_create(team=team, kind="user", user=member, name="laptop")
    client.force_login(member)
    page = client.get(reverse("frontend:team", args=[team.slug])).content.decode()
    url = reverse("frontend:team-token-rotate", args=[team.slug, old.pk])
    assert url in page
    response = client.post(url)
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert _stored_anywhere(client, response, "sp_") == []
    key = _key_in(response.content.decode())
    assert key.startswith("sp_") and key != old_key and "not shown again" in response.content.decode()
    old.refresh_from_db()
    new = ApiToken.objects.get(team=team, user=member, revoked_at__isnull=True)
    assert old.revoked_at is not None and new.name == "laptop"
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert client.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {old_key}").status_code == 401
    assert key not in client.get(reverse("frontend:team", args=[team.slug])).content.decode()


def test_only_the_tokens_own_user_rotates_it(client):
    alpha, beta = make_team("alpha"), make_team("beta")
    admin = make_user(alpha, role=Role.ADMIN, username="ada")
    member = make_user(alpha, username="max")
    theirs, _ = api_token_create(team=alpha, kind="user", user=member, name="laptop")
    bea = make_user(beta, role=Role.ADMIN, username="bea")
    beta_token, _ = api_token_create(team=beta, kind="user", user=bea, name="b")
    client.force_login(admin)
    # The admin sees the member's token (to revoke it) but is offered no rotation of it...
    page = client.get(reverse("frontend:team", args=[alpha.slug])).content.decode()
    assert reverse("frontend:team-token-revoke", args=[alpha.slug, theirs.pk]) in page
    assert reverse("frontend:team-token-rotate", args=[alpha.slug, theirs.pk]) not in page
    # ... and is refused one: the key would act as the member.
    assert client.post(reverse("frontend:team-token-rotate", args=[alpha.slug, theirs.pk])).status_code == 403
    # Another team's token, by its team's page or by ours: 404.
    assert client.post(reverse("frontend:team-token-rotate", args=[beta.slug, beta_token.pk])).status_code == 404
    assert client.post(reverse("frontend:team-token-rotate", args=[alpha.slug, beta_token.pk])).status_code == 404
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists() and ApiToken.objects.count() == 2


def test_rotating_a_revoked_token_is_a_message(client):
    team = make_team("alpha")
    member = make_user(team, username="max")
    token, _ = api_token_create(team=team, kind="user", user=member, name="old")
    api_token_revoke(token=token)
    client.force_login(member)
    response = client.post(reverse("frontend:team-token-rotate", args=[team.slug, token.pk]), follow=True)
    assert response.status_code == 200
    assert [str(m) for m in response.context["messages"]] == ["the token is revoked or expired; create a new one"]
    assert ApiToken.objects.count() == 1
