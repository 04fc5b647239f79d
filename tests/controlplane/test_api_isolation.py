"""Team isolation on every route: another team's objects are invisible (404 / absent from
lists) and cannot be written; anonymous requests are refused; agent tokens reach only their own
instance and job. Routes are a table, so a new endpoint is one more line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.fleet.models import InstanceEvent, InterruptionNotice
from controlplane.jobs.models import JobEvent, JobGeneration, MetricSample, Reconfiguration, TrainingJob
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.credentials import credential_create
from controlplane.webhooks.models import AlertEndpoint, WebhookCredential
from tests.controlplane.api_helpers import TeamWorld, make_team_world, token_client

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # formatted with job, instance, token, notice ids of the *target* team
    kind: str  # "list": answers a page; "detail": one object; "write": changes something
    body: dict | list | None = None


ROUTES = [
    Route("get", "/api/v1/teams/", "list"),
    Route("get", "/api/v1/teams/{team}/", "detail"),
    Route("get", "/api/v1/tokens/", "list"),
    Route("get", "/api/v1/tokens/{token}/", "detail"),
    Route("delete", "/api/v1/tokens/{token}/", "write"),
    Route("get", "/api/v1/jobs/", "list"),
    Route("get", "/api/v1/jobs/{job}/", "detail"),
    Route("post", "/api/v1/jobs/{job}/cancel/", "write"),
    Route("post", "/api/v1/jobs/{job}/resume/", "write"),
    Route("get", "/api/v1/jobs/{job}/generations/", "detail"),
    Route("get", "/api/v1/jobs/{job}/reconfigurations/", "detail"),
    Route("get", "/api/v1/jobs/{job}/events/", "detail"),
    Route("get", "/api/v1/jobs/{job}/metrics/", "detail"),
    Route("post", "/api/v1/jobs/{job}/metrics/", "write", {"samples": [{"step": 5, "loss": 1.0}]}),
    Route("get", "/api/v1/instances/", "list"),
    Route("get", "/api/v1/instances/{instance}/", "detail"),
    Route("get", "/api/v1/instances/{instance}/events/", "detail"),
    Route("post", "/api/v1/instances/{instance}/heartbeat/", "write", {}),
    Route("get", "/api/v1/notices/", "list"),
    Route("get", "/api/v1/notices/{notice}/", "detail"),
    Route("get", "/api/v1/alert-endpoints/", "list"),
    Route("get", "/api/v1/alert-endpoints/{alert}/", "detail"),
    Route("patch", "/api/v1/alert-endpoints/{alert}/", "write", {"active": False}),
    Route("delete", "/api/v1/alert-endpoints/{alert}/", "write"),
    Route("post", "/api/v1/alert-endpoints/{alert}/rotate-secret/", "write", {}),
    Route("get", "/api/v1/webhook-credentials/", "list"),
    Route("get", "/api/v1/webhook-credentials/{credential}/", "detail"),
    Route("delete", "/api/v1/webhook-credentials/{credential}/", "write"),
    Route("post", "/api/v1/webhook-credentials/{credential}/rotate/", "write", {}),
]


def _populate(world: TeamWorld) -> dict[str, int]:
    """Give the world's job and instance one of every child object, so lists are not empty."""
    now = timezone.now()
    JobGeneration.objects.create(job=world.job, number=1, membership=[], layout={}, created_at=now)
    Reconfiguration.objects.create(job=world.job, trigger="manual", trigger_key=f"k{world.job.pk}",
                                   strategy="recycle", decided_at=now)
    JobEvent.objects.create(job=world.job, kind="submitted", message="x", at=now)
    MetricSample.objects.create(job=world.job, step=1, at=now, loss=2.0)
    InstanceEvent.objects.create(instance=world.instance, kind="state", to_state="pending", at=now)
    notice = InterruptionNotice.objects.create(
        team=world.team, source="aws_eventbridge", kind="interruption", dedup_key=f"d{world.instance.pk}",
        provider_instance_id=world.instance.provider_instance_id, instance=world.instance, received_at=now,
    )
    token = ApiToken.objects.filter(team=world.team, user=world.member).get()
    alert = alert_endpoint_create(team=world.team, url=f"https://hooks.example.com/{world.team.pk}")
    credential, _ = credential_create(team=world.team, source="gcp", scheme="token")
    return {"team": world.team.pk, "job": world.job.pk, "instance": world.instance.pk, "token": token.pk,
            "notice": notice.pk, "alert": alert.pk, "credential": credential.pk}


@pytest.fixture
def worlds():
    a, b = make_team_world(), make_team_world()
    return a, _populate(a), b, _populate(b)


def _call(client, route: Route, ids: dict[str, int]):
    url = route.path.format(**ids)
    if route.method in ("get", "delete"):
        return getattr(client, route.method)(url)
    return getattr(client, route.method)(url, route.body, format="json")


def _snapshot(world: TeamWorld) -> tuple:
    job = TrainingJob.objects.get(pk=world.job.pk)
    instance = type(world.instance).objects.get(pk=world.instance.pk)
    return (
        job.status, job.steps_done, MetricSample.objects.filter(job=job).count(),
        instance.last_heartbeat_at, ApiToken.objects.filter(team=world.team, revoked_at__isnull=False).count(),
        sorted(AlertEndpoint.objects.filter(team=world.team).values_list("id", "active", "signing_secret")),
        sorted(WebhookCredential.objects.filter(team=world.team).values_list("id", "revoked_at", "expires_at")),
    )


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
@pytest.mark.parametrize("who", ["admin", "member"])
def test_other_teams_objects_are_invisible_and_unwritable(worlds, route, who):
    a, _, b, b_ids = worlds
    client = a.admin_client if who == "admin" else a.member_client
    before = _snapshot(b)
    response = _call(client, route, b_ids)
    if route.kind == "list":
        assert response.status_code == 200, response.content
        results = response.json()["results"]
        assert results, "team A's own objects should be listed"
        teams = {row["id"] if "teams" in route.path else row["team"] for row in results}
        assert teams == {a.team.pk}
    else:
        assert response.status_code == 404, (response.status_code, response.content)
    assert _snapshot(b) == before


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_anonymous_and_bad_tokens_are_refused(worlds, route):
    a, a_ids, _, _ = worlds
    before = _snapshot(a)
    for client in (token_client(None), token_client("sp_not-a-real-key")):
        response = _call(client, route, a_ids)
        assert response.status_code == 401, (response.status_code, response.content)
        assert response["WWW-Authenticate"] == "Token"
    assert _snapshot(a) == before


# What an agent token may do, by route: its own instance and job only.
AGENT_OWN = {
    ("get", "/api/v1/jobs/{job}/"): 200,
    ("get", "/api/v1/jobs/{job}/generations/"): 200,
    ("get", "/api/v1/jobs/{job}/metrics/"): 200,
    ("post", "/api/v1/jobs/{job}/metrics/"): 201,
    ("get", "/api/v1/instances/{instance}/"): 200,
    ("post", "/api/v1/instances/{instance}/heartbeat/"): 200,
}


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_agent_token_reaches_only_its_instance_and_job(worlds, route):
    a, a_ids, b, b_ids = worlds
    allowed = AGENT_OWN.get((route.method, route.path))
    own = _call(a.agent_client, route, a_ids)
    assert own.status_code == (allowed or 403), (own.status_code, own.content)

    # Another job/instance of the agent's own team is out of reach too.
    from tests.controlplane.factories import make_instance, make_job

    sibling_job = make_job(a.team)
    sibling_ids = {**a_ids, "job": sibling_job.pk, "instance": make_instance(a.team, job=sibling_job).pk}
    before = _snapshot(b)
    for ids in (sibling_ids, b_ids):
        response = _call(a.agent_client, route, ids)
        assert response.status_code == (404 if allowed else 403), (ids, response.status_code, response.content)
    assert _snapshot(b) == before
    assert MetricSample.objects.filter(job=sibling_job).count() == 0


def test_session_user_sees_all_own_teams_but_token_only_its_team(worlds):
    """A user in two teams: the browser session sees both; a token of one team sees that team."""
    from controlplane.accounts.models import Membership
    from tests.controlplane.api_helpers import make_api_token

    a, _, b, _ = worlds
    Membership.objects.create(team=b.team, user=a.member)
    session = token_client(None)
    session.force_login(a.member)
    jobs = {row["team"] for row in session.get("/api/v1/jobs/").json()["results"]}
    assert jobs == {a.team.pk, b.team.pk}
    key = make_api_token(a.team, user=a.member)
    jobs = {row["team"] for row in token_client(key).get("/api/v1/jobs/").json()["results"]}
    assert jobs == {a.team.pk}


def test_write_to_another_team_by_id_in_body_is_refused(worlds):
    a, _, b, _ = worlds
    jobs_before, tokens_before = TrainingJob.objects.count(), ApiToken.objects.count()
    spec = {"kind": "mlp", "layers": 2, "d_model": 8, "global_batch": 4, "micro_batches": 2}
    response = a.admin_client.post("/api/v1/jobs/", {"team": b.team.pk, "name": "x", "model_spec": spec,
                                                     "target_steps": 5, "budget_usd": "1"}, format="json")
    assert response.status_code == 400 and "team" in response.json()["errors"]
    response = a.admin_client.post("/api/v1/tokens/", {"team": b.team.pk, "name": "x"}, format="json")
    assert response.status_code == 400 and "team" in response.json()["errors"]
    response = a.admin_client.post("/api/v1/tokens/", {"kind": "agent", "instance": b.instance.pk}, format="json")
    assert response.status_code == 400 and "instance" in response.json()["errors"]
    assert (TrainingJob.objects.count(), ApiToken.objects.count()) == (jobs_before, tokens_before)
