"""Token authentication end to end: create, use, list, revoke, expiry, wrong keys; the
plaintext key is returned once and never stored."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.accounts.services import api_token_revoke, membership_remove
from controlplane.common.errors import DomainError
from tests.controlplane.api_helpers import make_api_token, make_api_user, make_team_world, token_client
from tests.controlplane.factories import make_team

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return make_team_world()


def _all_text_in_database() -> str:
    """Every value of every column of the token table, as text (to look for a leaked key)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {ApiToken._meta.db_table}")
        return " ".join(str(value) for row in cursor.fetchall() for value in row)


def test_admin_creates_a_token_whose_key_works_and_is_stored_only_hashed(world):
    response = world.admin_client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    key = body["key"]
    assert key.startswith("sp_") and len(key) > 40
    token = ApiToken.objects.get(pk=body["id"])
    assert token.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert token.prefix == key[:12] == body["prefix"]
    assert key not in _all_text_in_database()
    # The key authenticates as the admin within the team.
    me = token_client(key).get("/api/v1/teams/")
    assert me.status_code == 200 and [t["id"] for t in me.json()["results"]] == [world.team.pk]
    assert me.json()["results"][0]["my_role"] == "admin"
    # Shown once: neither the list nor the detail carries it.
    listed = world.admin_client.get("/api/v1/tokens/").json()["results"]
    assert all("key" not in row for row in listed)
    assert "key" not in world.admin_client.get(f"/api/v1/tokens/{token.pk}/").json()
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_bearer_keyword_works_too(world):
    key = make_api_token(world.team, user=world.member)
    client = token_client(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/jobs/").status_code == 200


def test_admin_creates_an_agent_token_bound_to_an_instance(world):
    response = world.admin_client.post(
        "/api/v1/tokens/", {"kind": "agent", "instance": world.instance.pk, "name": "node-0"}, format="json"
    )
    assert response.status_code == 201, response.content
    agent = token_client(response.json()["key"])
    assert agent.get(f"/api/v1/instances/{world.instance.pk}/").status_code == 200
    assert agent.get("/api/v1/jobs/").status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "agent"}, "instance"),  # an agent token needs its instance
        ({"kind": "robot"}, "kind"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"instance": 10**9, "kind": "agent"}, "instance"),
        ({"instance": "one"}, "instance"),
        ({"name": "x" * 101}, "name"),
        ({"name": 0}, "name"),  # a string field takes only strings (DRF would store "0")
        ({"name": ["a"]}, "name"),
        ({"team": "a"}, "team"),
    ],
)
def test_bad_token_input_names_the_field_and_creates_nothing(world, body, field):
    before = ApiToken.objects.count()
    response = world.admin_client.post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert field in response.json()["detail"]
    assert ApiToken.objects.count() == before


def test_members_cannot_create_tokens_and_see_only_their_own(world):
    before = ApiToken.objects.count()
    response = world.member_client.post("/api/v1/tokens/", {"name": "mine"}, format="json")
    assert response.status_code == 403
    assert ApiToken.objects.count() == before
    mine = world.member_client.get("/api/v1/tokens/").json()["results"]
    assert {row["user"] for row in mine} == {world.member.pk}
    everything = world.admin_client.get("/api/v1/tokens/").json()["results"]
    assert {row["kind"] for row in everything} == {"user", "agent"}
    assert len(everything) == ApiToken.objects.filter(team=world.team).count()
    # A member cannot revoke someone else's token (not visible: 404).
    admin_token = ApiToken.objects.get(user=world.admin)
    assert world.member_client.delete(f"/api/v1/tokens/{admin_token.pk}/").status_code == 404
    admin_token.refresh_from_db()
    assert admin_token.revoked_at is None


def test_revoked_token_stops_working_and_revoking_twice_is_harmless(world):
    key = make_api_token(world.team, user=world.member)
    token = ApiToken.objects.get(prefix=key[:12])
    client = token_client(key)
    assert client.get("/api/v1/jobs/").status_code == 200
    assert world.admin_client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    token.refresh_from_db()
    first = token.revoked_at
    assert first is not None
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]
    assert world.admin_client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    token.refresh_from_db()
    assert token.revoked_at == first
    assert world.admin_client.get("/api/v1/tokens/?active=false").json()["count"] == 1


def test_member_may_revoke_own_token(world):
    key = make_api_token(world.team, user=world.member)
    token = ApiToken.objects.get(prefix=key[:12])
    assert world.member_client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    assert token_client(key).get("/api/v1/jobs/").status_code == 401


def test_expired_token_is_refused(world):
    key = make_api_token(world.team, user=world.member, expires_at=timezone.now() + timedelta(minutes=5))
    assert token_client(key).get("/api/v1/jobs/").status_code == 200
    ApiToken.objects.filter(prefix=key[:12]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert token_client(key).get("/api/v1/jobs/").status_code == 401


def test_a_user_token_expires_within_its_lifetime_by_default(world, settings):
    """SPOTPIPE_USER_TOKEN_MAX_DAYS: a token created without an expiry gets it, one asked to live
    longer is a 400, so a forgotten key stops working on its own."""
    settings.SPOTPIPE_USER_TOKEN_MAX_DAYS = 30
    made = world.admin_client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert made.status_code == 201, made.content
    expires = ApiToken.objects.get(pk=made.json()["id"]).expires_at
    assert timedelta(days=29.9) < expires - timezone.now() <= timedelta(days=30)
    longer = (timezone.now() + timedelta(days=31)).isoformat()
    refused = world.admin_client.post("/api/v1/tokens/", {"name": "ci", "expires_at": longer}, format="json")
    assert refused.status_code == 400 and "SPOTPIPE_USER_TOKEN_MAX_DAYS" in refused.json()["errors"]["expires_at"][0]
    # Rotating keeps the expiry.
    rotated = world.admin_client.post(f"/api/v1/tokens/{made.json()['id']}/rotate/", {}, format="json")
    assert ApiToken.objects.get(pk=rotated.json()["id"]).expires_at == expires


def test_a_token_name_no_store_accepts_is_a_400(world):
    from controlplane.accounts.services import api_token_create

    for name in ("ci\x00", "ci\ud800"):
        with pytest.raises(DomainError) as refused:
            api_token_create(team=world.team, user=world.admin, name=name)
        assert refused.value.field == "name"


@pytest.mark.parametrize(
    "header",
    ["Token", "Token a b", "Token sp_wrong", "Bearer ", "Token " + "x" * 500],
)
def test_malformed_or_wrong_keys_answer_401(world, header):
    client = token_client(None)
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response.json()["detail"]


def test_user_who_left_the_team_loses_access_through_old_tokens(world):
    other = make_api_user(world.team, role="admin")
    key = make_api_token(world.team, user=other)
    assert token_client(key).get("/api/v1/jobs/").json()["count"] == 1
    membership_remove(team=world.team, user=other)
    assert token_client(key).get("/api/v1/jobs/").status_code == 401  # revoked on removal


def test_token_services_refuse_inconsistent_tokens(world):
    stranger = make_api_user(make_team())
    with pytest.raises(DomainError) as err:
        make_api_token(world.team, user=stranger)
    assert err.value.field == "user"
    token = ApiToken.objects.filter(team=world.team).first()
    api_token_revoke(token=token)
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


# --- rotation (issue 21, "API completeness") ---------------------------------------------------------


def test_a_user_rotates_their_token_the_old_key_stops_and_the_new_one_works(world):
    old_key = make_api_token(world.team, user=world.member, name="ci")
    client = token_client(old_key)
    old = ApiToken.objects.get(name="ci")
    response = client.post(f"/api/v1/tokens/{old.pk}/rotate/")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["name"] == "ci" and data["user"] == world.member.pk and data["key"] != old_key
    assert client.get("/api/v1/teams/").status_code == 401  # the old key is revoked at once
    assert token_client(data["key"]).get("/api/v1/teams/").status_code == 200
    again = token_client(data["key"]).post(f"/api/v1/tokens/{old.pk}/rotate/")
    assert again.status_code == 409 and "token" in again.json()["errors"]


def test_nobody_rotates_another_users_token(world):
    make_api_token(world.team, user=world.member, name="members")
    token = ApiToken.objects.get(name="members")
    assert world.admin_client.post(f"/api/v1/tokens/{token.pk}/rotate/").status_code == 403
    other = make_team_world("other-team")
    assert other.admin_client.post(f"/api/v1/tokens/{token.pk}/rotate/").status_code == 404
    assert other.agent_client.post(f"/api/v1/tokens/{token.pk}/rotate/").status_code == 403
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
