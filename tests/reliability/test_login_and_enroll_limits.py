"""Rate limits on the remaining guessing targets (issue 21): the admin site's login form shares the
login budget of /accounts/login/ per client address, and agent enrolment (whose enrolment key is a
bearer secret) is limited per client address too."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.controlplane.factories import make_user
from tests.reliability.test_security import _fresh_ip

pytestmark = pytest.mark.django_db


@pytest.fixture
def limited(monkeypatch):
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_LOGIN", "4")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_ENROLL", "3")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WINDOW_S", "3600")  # no window boundary inside the test


def test_admin_login_is_rate_limited(limited):
    user = make_user(username="root-ish")
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    client, ip = Client(), _fresh_ip()
    statuses = [client.post("/admin/login/", {"username": "root-ish", "password": f"guess-{i}"},
                            REMOTE_ADDR=ip).status_code for i in range(6)]
    assert statuses == [200] * 4 + [429] * 2


def test_both_login_forms_share_one_budget(limited):
    make_user(username="ada")
    client, ip = Client(), _fresh_ip()

    def guess(form: str, password: str) -> int:
        return client.post(form, {"username": "ada", "password": password}, REMOTE_ADDR=ip).status_code

    assert [guess("/accounts/login/", "g1"), guess("/accounts/login/", "g2")] == [200, 200]
    assert [guess("/admin/login/", "h1"), guess("/admin/login/", "h2")] == [200, 200]
    assert [guess("/admin/login/", "x"), guess("/accounts/login/", "y")] == [429, 429]


def test_enrolment_guesses_are_rate_limited(limited):
    client, ip = Client(), _fresh_ip()
    body = {"enroll_key": "1.guess", "provider_instance_id": "i-0123456789abcdef0"}
    statuses = [client.post("/api/v1/agents/enroll/", body, content_type="application/json",
                            REMOTE_ADDR=ip).status_code for _ in range(5)]
    assert statuses == [403] * 3 + [429] * 2
    # Another address has its own budget.
    other = client.post("/api/v1/agents/enroll/", body, content_type="application/json", REMOTE_ADDR=_fresh_ip())
    assert other.status_code == 403  # an unknown enrolment key is refused (403), not throttled
