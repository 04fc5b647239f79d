"""Account services (teams, memberships) and the teams endpoints."""

from __future__ import annotations

import pytest

from controlplane.accounts.models import ApiToken, Membership, Role
from controlplane.accounts.services import membership_add, membership_remove, team_create
from controlplane.common.errors import Conflict, DomainError
from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client

pytestmark = pytest.mark.django_db


def test_team_create_makes_the_creator_admin_and_refuses_duplicate_slugs():
    ada = make_api_user()
    team = team_create(name="ML Research", admin=ada)
    assert team.slug == "ml-research"
    assert Membership.objects.get(team=team, user=ada).role == Role.ADMIN
    with pytest.raises(Conflict) as err:
        team_create(name="ml research")
    assert err.value.field == "slug"
    with pytest.raises(DomainError) as err:
        team_create(name="   ")
    assert err.value.field == "name"


def test_membership_add_changes_role_and_remove_keeps_one_admin():
    ada, bob = make_api_user(), make_api_user()
    team = team_create(name="infra", admin=ada)
    membership_add(team=team, user=bob)
    assert membership_add(team=team, user=bob, role=Role.ADMIN).role == Role.ADMIN
    assert Membership.objects.filter(team=team).count() == 2
    with pytest.raises(DomainError):
        membership_add(team=team, user=bob, role="owner")
    membership_remove(team=team, user=bob)
    with pytest.raises(Conflict):
        membership_remove(team=team, user=ada)  # the last admin stays
    with pytest.raises(DomainError):
        membership_remove(team=team, user=bob)


def test_teams_endpoint_shows_role_and_members_and_session_sees_every_team():
    ada = make_api_user()
    first = team_create(name="first", admin=ada)
    second = team_create(name="second")
    membership_add(team=second, user=ada)
    membership_add(team=second, user=make_api_user())
    session = token_client(None)
    session.force_login(ada)
    rows = session.get("/api/v1/teams/?ordering=name").json()["results"]
    assert [(r["slug"], r["my_role"], r["member_count"]) for r in rows] == [("first", "admin", 1),
                                                                            ("second", "member", 2)]
    # The browsable API renders too (it uses the same filters).
    assert session.get("/api/v1/jobs/?status=running", HTTP_ACCEPT="text/html").status_code == 200
    # A token of the first team sees the first team only.
    only_first = token_client(make_api_token(first, user=ada)).get("/api/v1/teams/").json()["results"]
    assert [r["id"] for r in only_first] == [first.pk]
    assert token_client(make_api_token(first, user=ada)).get(f"/api/v1/teams/{second.pk}/").status_code == 404
    assert ApiToken.objects.filter(team=first).count() == 2
