"""Teams and their members through the API and the operator's command (issue 21, "API
completeness"): staff create a team with its first admin and token (`POST /teams/`, `manage.py
create_team`); members list a team's members; admins add, re-role and remove them; the last admin
stays; another team is 404, a member doing an admin's work 403, bad input 400 naming the field and
nothing half-written."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from controlplane.accounts.models import ApiToken, Membership, Role, Team
from tests.controlplane.api_helpers import make_api_token, make_api_user, make_team_world, token_client

pytestmark = pytest.mark.django_db
User = get_user_model()


@pytest.fixture
def staff_client():
    world = make_team_world("ops")
    world.admin.is_staff = True
    world.admin.save(update_fields=["is_staff"])
    return world.admin_client


# --- creating a team -----------------------------------------------------------------------------


def test_staff_create_a_team_with_a_new_admin_whose_token_works(staff_client):
    response = staff_client.post("/api/v1/teams/", {"name": "Vision Lab", "admin": "vera",
                                                    "admin_email": "vera@example.com"}, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["team"]["slug"] == "vision-lab" and data["admin"] == {
        "id": data["admin"]["id"], "username": "vera", "created": True}
    vera = User.objects.get(username="vera")
    assert not vera.has_usable_password() and vera.email == "vera@example.com"
    assert Membership.objects.get(team__slug="vision-lab", user=vera).role == Role.ADMIN
    # The key is shown once and works: vera sees her team, as its admin.
    teams = token_client(data["token"]["key"]).get("/api/v1/teams/").json()["results"]
    assert [(t["slug"], t["my_role"]) for t in teams] == [("vision-lab", "admin")]
    assert "key" not in staff_client.get(f"/api/v1/tokens/{data['token']['id']}/").json()


def test_an_existing_user_becomes_the_admin(staff_client):
    existing = make_api_user()
    response = staff_client.post("/api/v1/teams/", {"name": "NLP", "slug": "nlp-team",
                                                    "admin": existing.username}, format="json")
    assert response.status_code == 201
    assert response.json()["admin"]["created"] is False
    assert Membership.objects.get(team__slug="nlp-team", user=existing).role == Role.ADMIN


def test_only_staff_create_teams():
    world = make_team_world("plain")
    for client in (world.admin_client, world.member_client):
        assert client.post("/api/v1/teams/", {"name": "x", "admin": "y"}, format="json").status_code == 403
    assert world.agent_client.post("/api/v1/teams/", {"name": "x", "admin": "y"}, format="json").status_code == 403
    assert token_client().post("/api/v1/teams/", {"name": "x", "admin": "y"}, format="json").status_code == 401
    assert not Team.objects.filter(name="x").exists() and not User.objects.filter(username="y").exists()


@pytest.mark.parametrize("body, field", [
    ({"admin": "ann"}, "name"),
    ({"name": "  ", "admin": "ann"}, "name"),
    ({"name": "T", "admin": "bad name!"}, "admin"),
    ({"name": "T", "admin": "x" * 151}, "admin"),
    ({"name": "T", "admin": "ann", "slug": "not a slug"}, "slug"),
    ({"name": "T", "admin": "ann", "admin_email": "nope"}, "admin_email"),
    ({"name": "x" * 101, "admin": "ann"}, "name"),
    ({"name": 7, "admin": "ann"}, "name"),  # string fields take only strings
    ({"name": "T", "admin": 1}, "admin"),
    ({"name": "T", "admin": "ann", "slug": 12}, "slug"),
    ({"name": "a" * 100, "admin": "ann"}, "slug"),  # a slug derived from a long name is as long (500 once)
])
def test_bad_input_is_400_naming_the_field_and_writes_nothing(staff_client, body, field):
    teams, users, tokens = Team.objects.count(), User.objects.count(), ApiToken.objects.count()
    response = staff_client.post("/api/v1/teams/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert (Team.objects.count(), User.objects.count(), ApiToken.objects.count()) == (teams, users, tokens)


def test_a_taken_slug_is_409_and_the_new_user_is_not_left_behind(staff_client):
    response = staff_client.post("/api/v1/teams/", {"name": "Ops", "admin": "newcomer"}, format="json")
    assert response.status_code == 409 and "slug" in response.json()["errors"]
    assert not User.objects.filter(username="newcomer").exists()


def test_the_operators_command():
    out = io.StringIO()
    call_command("create_team", "Speech", "--admin", "sam", "--email", "sam@example.com", stdout=out)
    text = out.getvalue()
    assert "'speech'" in text and "created" in text
    key = text.rsplit("key (shown once): ", 1)[1].strip()
    assert token_client(key).get("/api/v1/teams/").json()["results"][0]["slug"] == "speech"
    with pytest.raises(CommandError, match="slug"):
        call_command("create_team", "Speech", "--admin", "other", stdout=io.StringIO())
    with pytest.raises(CommandError, match="admin"):
        call_command("create_team", "Another", "--admin", "bad name!", stdout=io.StringIO())
    assert not User.objects.filter(username="other").exists() and not Team.objects.filter(name="Another").exists()


# --- members ------------------------------------------------------------------------------------


@pytest.fixture
def worlds():
    return make_team_world("alpha"), make_team_world("beta")


def test_members_list_roles_to_every_member(worlds):
    alpha, beta = worlds
    response = alpha.member_client.get(f"/api/v1/teams/{alpha.team.pk}/members/")
    assert response.status_code == 200
    assert {(m["username"], m["role"]) for m in response.json()} == {
        (alpha.admin.username, "admin"), (alpha.member.username, "member")}
    assert alpha.member_client.get(f"/api/v1/teams/{beta.team.pk}/members/").status_code == 404
    assert alpha.agent_client.get(f"/api/v1/teams/{alpha.team.pk}/members/").status_code == 403


def test_admins_add_change_and_remove_members(worlds):
    alpha, _ = worlds
    newcomer = make_api_user()
    url = f"/api/v1/teams/{alpha.team.pk}/members/"
    response = alpha.admin_client.post(url, {"username": newcomer.username, "role": "member"}, format="json")
    assert response.status_code == 201 and response.json()["role"] == "member"
    assert alpha.admin_client.post(url, {"username": newcomer.username}, format="json").status_code == 409
    response = alpha.admin_client.patch(f"{url}{newcomer.pk}/", {"role": "admin"}, format="json")
    assert response.status_code == 200 and response.json()["role"] == "admin"
    key = make_api_token(alpha.team, user=newcomer)
    assert alpha.admin_client.delete(f"{url}{newcomer.pk}/").status_code == 204
    assert not Membership.objects.filter(team=alpha.team, user=newcomer).exists()
    assert token_client(key).get("/api/v1/teams/").status_code == 401  # their token of the team is revoked


def test_members_cannot_manage_members(worlds):
    alpha, _ = worlds
    url = f"/api/v1/teams/{alpha.team.pk}/members/"
    outsider = make_api_user()
    assert alpha.member_client.post(url, {"username": outsider.username}, format="json").status_code == 403
    assert alpha.member_client.patch(f"{url}{alpha.member.pk}/", {"role": "admin"}, format="json").status_code == 403
    assert alpha.member_client.delete(f"{url}{alpha.admin.pk}/").status_code == 403
    assert Membership.objects.get(team=alpha.team, user=alpha.member).role == Role.MEMBER


def test_another_teams_members_are_404(worlds):
    alpha, beta = worlds
    url = f"/api/v1/teams/{beta.team.pk}/members/"
    assert alpha.admin_client.post(url, {"username": alpha.member.username}, format="json").status_code == 404
    assert alpha.admin_client.patch(f"{url}{beta.member.pk}/", {"role": "admin"}, format="json").status_code == 404
    assert alpha.admin_client.delete(f"{url}{beta.member.pk}/").status_code == 404
    # A user of another team, named through alpha's URL, is not a member there: 404.
    own = f"/api/v1/teams/{alpha.team.pk}/members/"
    assert alpha.admin_client.delete(f"{own}{beta.member.pk}/").status_code == 404
    assert Membership.objects.filter(team=beta.team).count() == 2


def test_the_last_admin_stays(worlds):
    alpha, _ = worlds
    url = f"/api/v1/teams/{alpha.team.pk}/members/{alpha.admin.pk}/"
    response = alpha.admin_client.patch(url, {"role": "member"}, format="json")
    assert response.status_code == 409 and "role" in response.json()["errors"]
    response = alpha.admin_client.delete(url)
    assert response.status_code == 409 and "user" in response.json()["errors"]
    assert Membership.objects.get(team=alpha.team, user=alpha.admin).role == Role.ADMIN


@pytest.mark.parametrize("body, field", [
    ({"username": "nobody-at-all"}, "username"),
    ({"username": "x", "role": "owner"}, "role"),
    ({}, "username"),
])
def test_bad_member_input_is_400_naming_the_field(worlds, body, field):
    alpha, _ = worlds
    if body.get("username") == "x":
        body["username"] = make_api_user().username
    response = alpha.admin_client.post(f"/api/v1/teams/{alpha.team.pk}/members/", body, format="json")
    assert response.status_code == 400 and field in response.json()["errors"]
    assert Membership.objects.filter(team=alpha.team).count() == 2
