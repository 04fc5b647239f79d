"""Secrets made on the team page (issue 21): a new API key and an alert's signing secret (and its
URL, which may hold a secret of its own) are shown once in the response page itself, never in
Django's messages, whose default storage is a cookie (then the session), nor in a cache."""

from __future__ import annotations

import pytest
from django.contrib.messages.storage.cookie import CookieStorage
from django.test import RequestFactory
from django.urls import reverse

from controlplane.accounts.models import Role
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
