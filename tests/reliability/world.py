"""A two-team world for the reliability tests: team A owns every object named in a URL; team B is
the outsider. Each principal is a client already carrying its credential."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from controlplane.accounts.models import ApiToken, Role, Team
from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.jobs.models import Package, TrainingJob
from controlplane.jobs.packages import package_store
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.credentials import credential_create
from controlplane.webhooks.models import AlertEndpoint, WebhookCredential
from tests.controlplane.api_helpers import make_api_token, make_api_user
from tests.controlplane.factories import make_instance, make_job, make_team

PRINCIPALS = ("anon", "member_a", "admin_a", "member_b", "agent_own", "agent_other")
_seq = itertools.count(1)

# Strings that only team A's objects carry: none may appear in anything team B is shown.
MARKER = "alphamarker"


@dataclass
class World:
    team_a: Team
    team_b: Team
    member_a: Any
    admin_a: Any
    member_b: Any
    job: TrainingJob  # team A's job, run by `instance`
    instance: Instance  # team A's instance, the agent_own principal's
    other_job: TrainingJob  # another job of team A, run by `other_instance`
    other_instance: Instance
    notice: InterruptionNotice
    member_a_token: ApiToken  # the token member A authenticates with
    alert_endpoint: AlertEndpoint  # team A's outbound alert URL
    credential: WebhookCredential  # team A's inbound webhook credential
    package: Package  # a package file team A uploaded for its jobs' requirements
    keys: dict[str, str] = field(default_factory=dict)  # principal -> API key

    def ids(self) -> dict[str, Any]:
        """Values for the URL templates of the matrix."""
        return {
            "team": self.team_a.pk, "slug": self.team_a.slug, "job": self.job.pk, "instance": self.instance.pk,
            "notice": self.notice.pk, "token": self.member_a_token.pk, "user": self.member_a.pk,
            "username": self.member_a.username,
            "alert": self.alert_endpoint.pk, "credential": self.credential.pk, "package": self.package.sha256,
        }

    def api_client(self, principal: str, **client_kwargs: Any) -> Client:
        """A client authenticating with the principal's API token (none for anon)."""
        client = Client(**client_kwargs)
        if principal in self.keys:
            client.defaults["HTTP_AUTHORIZATION"] = f"Token {self.keys[principal]}"
        return client

    def session_client(self, principal: str, **client_kwargs: Any) -> Client:
        """A browser: logged-in users have a session; agents can only send their token header."""
        client = Client(**client_kwargs)
        user = {"member_a": self.member_a, "admin_a": self.admin_a, "member_b": self.member_b}.get(principal)
        if user is not None:
            client.force_login(user)
        elif principal.startswith("agent"):
            client.defaults["HTTP_AUTHORIZATION"] = f"Token {self.keys[principal]}"
        return client


def make_world() -> World:
    n = next(_seq)
    team_a = make_team(f"{MARKER}-team-{n}")
    team_b = make_team(f"bravo-team-{n}")
    member_a = make_api_user(team_a, role=Role.MEMBER)
    admin_a = make_api_user(team_a, role=Role.ADMIN)
    member_b = make_api_user(team_b, role=Role.ADMIN)  # even an admin of B has no rights on A
    job = make_job(team_a, name=f"{MARKER}-job-{n}")
    other_job = make_job(team_a, name=f"{MARKER}-other-job-{n}")
    now = timezone.now()
    instance = make_instance(team_a, job=job, state="running", running_at=now,
                             provider_instance_id=f"i-{MARKER}-{n}")
    other_instance = make_instance(team_a, job=other_job, state="running", running_at=now,
                                   provider_instance_id=f"i-{MARKER}-other-{n}")
    notice = InterruptionNotice.objects.create(
        team=team_a, source="aws_eventbridge", kind="interruption", action="terminate",
        dedup_key=f"{MARKER}-dedup-{n}", cloud_event_id=f"{MARKER}-event-{n}",
        provider_instance_id=instance.provider_instance_id, instance=instance, received_at=now,
    )
    keys = {
        "member_a": make_api_token(team_a, user=member_a, name=f"{MARKER}-token"),
        "admin_a": make_api_token(team_a, user=admin_a),
        "member_b": make_api_token(team_b, user=member_b),
        "agent_own": make_api_token(team_a, instance=instance),
        "agent_other": make_api_token(team_a, instance=other_instance),
    }
    member_a_token = ApiToken.objects.get(team=team_a, user=member_a)
    alert_endpoint = alert_endpoint_create(team=team_a, url=f"https://hooks.example.com/{MARKER}-{n}")
    credential, _ = credential_create(team=team_a, source="gcp", scheme="token", name=f"{MARKER}-credential-{n}")
    package, _ = package_store(team=team_a, user=member_a,
                               upload=SimpleUploadedFile(f"{MARKER}-1.0-py3-none-any.whl", b"world package"))
    return World(team_a=team_a, team_b=team_b, member_a=member_a, admin_a=admin_a, member_b=member_b, job=job,
                 instance=instance, other_job=other_job, other_instance=other_instance, notice=notice,
                 member_a_token=member_a_token, alert_endpoint=alert_endpoint, credential=credential,
                 package=package, keys=keys)
