"""Helpers for the API tests: tokens, authenticated clients and a small two-team world."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from controlplane.accounts.models import Membership, Role, Team
from controlplane.accounts.services import api_token_create
from controlplane.fleet.models import Instance
from controlplane.jobs.models import TrainingJob
from tests.controlplane.factories import make_instance, make_job, make_team

_users = itertools.count(1)


def make_api_user(team: Team | None = None, *, role: str = Role.MEMBER) -> Any:
    """A user with no usable password (token or force_login only), so no slow password hashing."""
    user = get_user_model().objects.create_user(username=f"apiuser{next(_users)}", password=None)
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


def make_api_token(team: Team, *, user: Any = None, instance: Instance | None = None, **overrides: Any) -> str:
    """A user token (for `user`) or an agent token (for `instance`); returns the plaintext key."""
    kind = "agent" if instance is not None else "user"
    _, key = api_token_create(team=team, kind=kind, user=user, instance=instance, **overrides)
    return key


def token_client(key: str | None = None) -> APIClient:
    """A DRF test client sending `Authorization: Token <key>` (anonymous without a key)."""
    client = APIClient()
    if key:
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@dataclass
class TeamWorld:
    """One team with an admin, a member, a job, an instance of the job, and their clients."""

    team: Team
    admin: Any
    member: Any
    job: TrainingJob
    instance: Instance
    admin_client: APIClient
    member_client: APIClient
    agent_client: APIClient


def make_team_world(slug: str | None = None) -> TeamWorld:
    team = make_team(slug)
    admin = make_api_user(team, role=Role.ADMIN)
    member = make_api_user(team, role=Role.MEMBER)
    job = make_job(team)
    instance = make_instance(team, job=job)
    return TeamWorld(
        team=team, admin=admin, member=member, job=job, instance=instance,
        admin_client=token_client(make_api_token(team, user=admin)),
        member_client=token_client(make_api_token(team, user=member)),
        agent_client=token_client(make_api_token(team, instance=instance)),
    )
