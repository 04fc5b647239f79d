"""The webhook management API: a team's alert endpoints (/api/v1/alert-endpoints/) and inbound
webhook credentials (/api/v1/webhook-credentials/). Members read, admins write, other teams see
nothing, secrets are answered once and never listed or logged."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.webhooks import alerts, signing
from controlplane.webhooks.models import AlertEndpoint, WebhookCredential
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_job

pytestmark = pytest.mark.django_db

EVENT = {
    "version": "0", "id": "7e9b5f2c-0000-4000-8000-000000000001", "source": "aws.ec2",
    "detail-type": "EC2 Spot Instance Interruption Warning", "account": "123456789012",
    "time": "2026-11-20T14:02:00Z", "region": "us-east-1", "resources": [],
    "detail": {"instance-id": "i-0123456789abcdef0", "instance-action": "terminate"},
}


@pytest.fixture(autouse=True)
def _isolated(webhook_isolation):
    """No hand-off, empty credential caches (tests/controlplane/conftest.py)."""


@pytest.fixture
def world():
    return make_team_world()


def _post_eventbridge(client, team_slug: str, key: str, event_id: str):
    return client.post(f"/api/v1/webhooks/aws/eventbridge/{team_slug}/", data=json.dumps({**EVENT, "id": event_id}),
                       content_type="application/json", headers={"x-api-key": key})


# --- alert endpoints -----------------------------------------------------------------------------


def test_admin_registers_an_endpoint_and_sees_the_secret_once(world):
    response = world.admin_client.post("/api/v1/alert-endpoints/", {
        "url": "https://hooks.example.com/spotpipe", "format": "slack", "events": ["job.failed", "budget.threshold"],
    }, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    secret = created["signing_secret"]
    assert secret.startswith("whsec_")
    endpoint = AlertEndpoint.objects.get(pk=created["id"])
    assert (endpoint.team_id, endpoint.url, endpoint.format, endpoint.events, endpoint.signing_secret) == (
        world.team.pk, "https://hooks.example.com/spotpipe", "slack", ["job.failed", "budget.threshold"], secret)
    for client in (world.admin_client, world.member_client):
        listed = client.get("/api/v1/alert-endpoints/")
        assert listed.status_code == 200
        assert [row["id"] for row in listed.json()["results"]] == [endpoint.pk]
        detail = client.get(f"/api/v1/alert-endpoints/{endpoint.pk}/")
        assert detail.status_code == 200
        assert secret not in listed.content.decode() + detail.content.decode()
        assert "signing_secret" not in detail.json()


def test_members_read_but_only_admins_write(world):
    endpoint = alerts.alert_endpoint_create(team=world.team, url="https://hooks.example.com/a")
    member = world.member_client
    assert member.post("/api/v1/alert-endpoints/", {"url": "https://x.example.com/"}, format="json").status_code == 403
    assert member.patch(f"/api/v1/alert-endpoints/{endpoint.pk}/", {"active": False},
                        format="json").status_code == 403
    assert member.post(f"/api/v1/alert-endpoints/{endpoint.pk}/rotate-secret/", {}, format="json").status_code == 403
    assert member.delete(f"/api/v1/alert-endpoints/{endpoint.pk}/").status_code == 403
    assert world.agent_client.get("/api/v1/alert-endpoints/").status_code == 403
    endpoint.refresh_from_db()
    assert endpoint.active and AlertEndpoint.objects.count() == 1


def test_another_teams_endpoints_are_invisible_and_unwritable(world):
    other = make_team_world()
    theirs = alerts.alert_endpoint_create(team=other.team, url="https://hooks.example.com/theirs")
    client = world.admin_client
    assert client.get("/api/v1/alert-endpoints/").json()["results"] == []
    assert client.get(f"/api/v1/alert-endpoints/{theirs.pk}/").status_code == 404
    assert client.patch(f"/api/v1/alert-endpoints/{theirs.pk}/", {"active": False}, format="json").status_code == 404
    assert client.post(f"/api/v1/alert-endpoints/{theirs.pk}/rotate-secret/", {}, format="json").status_code == 404
    assert client.delete(f"/api/v1/alert-endpoints/{theirs.pk}/").status_code == 404
    response = client.post("/api/v1/alert-endpoints/", {"team": other.team.pk, "url": "https://x.example.com/"},
                           format="json")
    assert response.status_code == 400 and "team" in response.json()["errors"]
    theirs_after = AlertEndpoint.objects.get(pk=theirs.pk)
    assert (theirs_after.active, theirs_after.signing_secret) == (True, theirs.signing_secret)


@pytest.mark.parametrize(("body", "field", "fragment"), [
    ({"url": "ftp://files.example.com/x"}, "url", "http:// or https://"),
    ({"url": "javascript:alert(1)"}, "url", "http:// or https://"),
    ({"url": "https://"}, "url", "host"),
    ({"url": "https://admin:hunter2-secret@hooks.example.com/x"}, "url", "credentials"),
    ({"url": "https://hooks.example.com/x y"}, "url", "whitespace"),
    ({"url": "https://hooks.example.com:99999/x"}, "url", "port"),
    ({"url": ""}, "url", ""),
    ({}, "url", "required"),
    ({"url": "https://hooks.example.com/" + "a" * 1000}, "url", "1000"),
    ({"url": "https://hooks.example.com/", "format": "teams"}, "format", ""),
    ({"url": "https://hooks.example.com/", "events": ["job.exploded"]}, "events[0]", ""),
    ({"url": "https://hooks.example.com/", "events": "job.failed"}, "events", ""),
])
def test_bad_endpoint_input_is_a_400_naming_the_field(world, body, field, fragment):
    response = world.admin_client.post("/api/v1/alert-endpoints/", body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert fragment in " ".join(errors[field])
    assert "hunter2-secret" not in response.content.decode()  # a URL's password is never echoed
    assert AlertEndpoint.objects.count() == 0


def test_patch_changes_only_the_given_fields_and_validates_them(world):
    endpoint = alerts.alert_endpoint_create(team=world.team, url="https://hooks.example.com/a", events=["job.failed"])
    response = world.admin_client.patch(f"/api/v1/alert-endpoints/{endpoint.pk}/", {"active": False},
                                        format="json")
    assert response.status_code == 200 and response.json()["active"] is False
    bad = world.admin_client.patch(f"/api/v1/alert-endpoints/{endpoint.pk}/",
                                   {"url": "https://u:p@hooks.example.com/"}, format="json")
    assert bad.status_code == 400 and "url" in bad.json()["errors"]
    endpoint.refresh_from_db()
    assert (endpoint.url, endpoint.events, endpoint.active) == ("https://hooks.example.com/a", ["job.failed"], False)
    assert world.admin_client.delete(f"/api/v1/alert-endpoints/{endpoint.pk}/").status_code == 204
    assert not AlertEndpoint.objects.filter(pk=endpoint.pk).exists()


def _deliver_and_capture(endpoint: AlertEndpoint, job) -> dict[str, str]:
    captured = {}

    def post(url, *, data, headers):
        captured.update(headers, body=data)
        return 200

    [delivery] = alerts.alert_job_status(job=job, status="failed", message="x")
    assert alerts.alert_deliver(delivery_id=delivery.pk, post=post) == "delivered"
    return captured


def _verifies(secret: str, captured: dict) -> bool:
    try:
        signing.verify(secrets_=[secret], msg_id=captured["webhook-id"], timestamp=captured["webhook-timestamp"],
                       signature=captured["webhook-signature"], body=captured["body"])
    except signing.SignatureError:
        return False
    return True


def test_rotating_the_secret_signs_with_both_during_the_grace_period(world):
    endpoint = alerts.alert_endpoint_create(team=world.team, url="https://hooks.example.com/a")
    old = endpoint.signing_secret
    response = world.admin_client.post(f"/api/v1/alert-endpoints/{endpoint.pk}/rotate-secret/", {"grace_hours": 2},
                                       format="json")
    assert response.status_code == 200, response.content
    new = response.json()["signing_secret"]
    assert new != old and new.startswith("whsec_")
    endpoint.refresh_from_db()
    until = endpoint.previous_secret_expires_at
    assert timedelta(hours=1.9) < until - timezone.now() <= timedelta(hours=2)
    captured = _deliver_and_capture(endpoint, make_job(world.team))
    assert _verifies(new, captured) and _verifies(old, captured)
    # Once the grace period is over only the new secret signs.
    AlertEndpoint.objects.filter(pk=endpoint.pk).update(previous_secret_expires_at=timezone.now() - timedelta(1))
    captured = _deliver_and_capture(endpoint, make_job(world.team))
    assert _verifies(new, captured) and not _verifies(old, captured)
    assert len(captured["webhook-signature"].split()) == 1


def test_the_admin_site_shows_neither_signing_secret(world, client):
    from django.contrib.auth import get_user_model

    endpoint = alerts.alert_endpoint_create(team=world.team, url="https://hooks.example.com/a")
    old = endpoint.signing_secret
    new = alerts.alert_endpoint_rotate_secret(endpoint=endpoint).signing_secret
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-0123456789"))
    page = client.get(f"/admin/webhooks/alertendpoint/{endpoint.pk}/change/")
    assert page.status_code == 200 and "hooks.example.com" in page.content.decode()
    assert old not in page.content.decode() and new not in page.content.decode()


def test_rotation_without_grace_and_bounds(world):
    endpoint = alerts.alert_endpoint_create(team=world.team, url="https://hooks.example.com/a")
    old = endpoint.signing_secret
    for bad in (-1, 24 * 31, "soon"):
        response = world.admin_client.post(f"/api/v1/alert-endpoints/{endpoint.pk}/rotate-secret/",
                                           {"grace_hours": bad}, format="json")
        assert response.status_code == 400 and "grace_hours" in response.json()["errors"]
    endpoint.refresh_from_db()
    assert endpoint.signing_secret == old
    response = world.admin_client.post(f"/api/v1/alert-endpoints/{endpoint.pk}/rotate-secret/", {"grace_hours": 0},
                                       format="json")
    assert response.status_code == 200
    captured = _deliver_and_capture(endpoint, make_job(world.team))
    assert not _verifies(old, captured) and _verifies(response.json()["signing_secret"], captured)


# --- inbound webhook credentials -----------------------------------------------------------------


def test_created_api_key_authenticates_the_webhook_until_revoked(world):
    response = world.admin_client.post("/api/v1/webhook-credentials/", {
        "source": "aws_eventbridge", "scheme": "api_key", "name": "prod connection", "header_name": "X-Api-Key",
    }, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    key = created["secret"]
    assert key.startswith("sp_wh_") and created["header_name"] == "x-api-key" and created["active"] is True
    cred = WebhookCredential.objects.get(pk=created["id"])
    assert key not in (cred.secret_hash, cred.signing_secret)
    listed = world.member_client.get("/api/v1/webhook-credentials/")
    assert listed.status_code == 200 and [r["id"] for r in listed.json()["results"]] == [cred.pk]
    detail = world.member_client.get(f"/api/v1/webhook-credentials/{cred.pk}/")
    for text in (listed.content.decode(), detail.content.decode()):
        assert key not in text and cred.secret_hash not in text and '"secret' not in text

    assert _post_eventbridge(world.admin_client, world.team.slug, key, "ev-1").status_code == 202
    assert world.member_client.delete(f"/api/v1/webhook-credentials/{cred.pk}/").status_code == 403
    assert world.admin_client.delete(f"/api/v1/webhook-credentials/{cred.pk}/").status_code == 204
    cred.refresh_from_db()
    assert cred.revoked_at is not None
    assert _post_eventbridge(world.admin_client, world.team.slug, key, "ev-2").status_code == 401
    inactive = world.member_client.get("/api/v1/webhook-credentials/?active=false").json()["results"]
    assert [r["id"] for r in inactive] == [cred.pk] and inactive[0]["active"] is False


def test_rotated_credential_overlaps_for_the_grace_period(world):
    created = world.admin_client.post("/api/v1/webhook-credentials/", {
        "source": "aws_eventbridge", "scheme": "api_key"}, format="json").json()
    response = world.admin_client.post(f"/api/v1/webhook-credentials/{created['id']}/rotate/", {"grace_hours": 1},
                                       format="json")
    assert response.status_code == 201, response.content
    successor = response.json()
    assert successor["id"] != created["id"] and successor["secret"] != created["secret"]
    old = WebhookCredential.objects.get(pk=created["id"])
    assert timedelta(minutes=59) < old.expires_at - timezone.now() <= timedelta(hours=1)
    for n, key in enumerate((created["secret"], successor["secret"])):
        assert _post_eventbridge(world.admin_client, world.team.slug, key, f"ev-rot-{n}").status_code == 202
    world.admin_client.delete(f"/api/v1/webhook-credentials/{created['id']}/")
    again = world.admin_client.post(f"/api/v1/webhook-credentials/{created['id']}/rotate/", {}, format="json")
    assert again.status_code == 409 and "id" in again.json()["errors"]  # its state forbids it


@pytest.mark.parametrize(("body", "field"), [
    ({"source": "aws_eventbridge", "scheme": "token"}, "scheme"),
    ({"source": "gcp", "scheme": "api_key"}, "scheme"),
    ({"source": "carrier-pigeon", "scheme": "api_key"}, "source"),
    ({"source": "aws_eventbridge", "scheme": "basic"}, "username"),
    ({"source": "aws_eventbridge", "scheme": "api_key", "header_name": "Authorization"}, "header_name"),
    ({"source": "aws_eventbridge", "scheme": "api_key", "header_name": "x api key"}, "header_name"),
    ({"source": "aws_eventbridge", "scheme": "api_key", "secret": "short-s3cr3t"}, "secret"),
    ({"source": "generic", "scheme": "standard_webhooks", "secret": "not-a-whsec-secret-%%%%"}, "secret"),
    ({"source": "aws_sns", "scheme": "sns_topic"}, "topic_arn"),
    ({"source": "aws_sns", "scheme": "sns_topic", "topic_arn": "spot-notices"}, "topic_arn"),
    ({"source": "gcp", "scheme": "oidc"}, "oidc"),
    ({"source": "gcp", "scheme": "oidc", "oidc": {"audience": "https://x"}}, "oidc.email"),
    ({"source": "gcp", "scheme": "oidc", "oidc": {"audience": "https://x", "email": "p@x.iam.gserviceaccount.com",
                                                  "public_keys": {}}}, "oidc.public_keys"),
    ({"source": "gcp", "scheme": "oidc", "oidc": {"audience": "https://x", "public_keys": {"k": "P"}}}, "oidc.email"),
    ({"source": "gcp", "scheme": "token",
      "oidc": {"audience": "a", "email": "p@x.iam.gserviceaccount.com", "public_keys": {"k": "pem"}}}, "oidc"),
])
def test_bad_credential_input_is_a_400_naming_the_field(world, body, field):
    response = world.admin_client.post("/api/v1/webhook-credentials/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    for secret in (body.get("secret"),):
        assert not secret or secret not in response.content.decode()
    assert WebhookCredential.objects.count() == 0


def test_each_source_gets_a_credential_that_fits(world):
    made = {}
    for body in (
        {"source": "aws_eventbridge", "scheme": "basic", "username": "eventbridge"},
        {"source": "aws_sns", "scheme": "sns_topic", "topic_arn": "arn:aws:sns:us-east-1:123456789012:spot"},
        {"source": "gcp", "scheme": "token"},
        {"source": "gcp", "scheme": "oidc",
         "oidc": {"audience": "https://cp.example.com/x", "email": "pusher@p.iam.gserviceaccount.com"}},
        {"source": "azure", "scheme": "standard_webhooks"},
        {"source": "generic", "scheme": "standard_webhooks", "secret": signing.generate_secret()},
    ):
        response = world.admin_client.post("/api/v1/webhook-credentials/", body, format="json")
        assert response.status_code == 201, (body, response.content)
        made[(body["source"], body["scheme"])] = response.json()
    assert made[("aws_sns", "sns_topic")]["secret"] == "" and made[("gcp", "oidc")]["secret"] == ""
    assert made[("azure", "standard_webhooks")]["secret"].startswith("whsec_")
    oidc = WebhookCredential.objects.get(pk=made[("gcp", "oidc")]["id"])
    assert oidc.config["audience"] == "https://cp.example.com/x"
    sns = world.admin_client.post(f"/api/v1/webhook-credentials/{made[('aws_sns', 'sns_topic')]['id']}/rotate/", {},
                                  format="json")
    assert sns.status_code == 400 and "scheme" in sns.json()["errors"]


def test_other_teams_credentials_and_agents(world):
    other = make_team_world()
    theirs = other.admin_client.post("/api/v1/webhook-credentials/", {"source": "gcp", "scheme": "token"},
                                     format="json").json()
    assert world.admin_client.get("/api/v1/webhook-credentials/").json()["results"] == []
    assert world.admin_client.get(f"/api/v1/webhook-credentials/{theirs['id']}/").status_code == 404
    assert world.admin_client.delete(f"/api/v1/webhook-credentials/{theirs['id']}/").status_code == 404
    assert world.admin_client.post(f"/api/v1/webhook-credentials/{theirs['id']}/rotate/", {},
                                   format="json").status_code == 404
    assert world.member_client.post("/api/v1/webhook-credentials/", {"source": "gcp", "scheme": "token"},
                                    format="json").status_code == 403
    assert world.agent_client.get("/api/v1/webhook-credentials/").status_code == 403
    assert WebhookCredential.objects.get(pk=theirs["id"]).revoked_at is None
    assert WebhookCredential.objects.filter(team=world.team).count() == 0


def test_secrets_never_reach_the_logs(world, caplog):
    caplog.set_level(logging.DEBUG)
    shown = []
    cred = world.admin_client.post("/api/v1/webhook-credentials/", {"source": "aws_eventbridge", "scheme": "api_key"},
                                   format="json").json()
    shown.append(cred["secret"])
    shown.append(world.admin_client.post(f"/api/v1/webhook-credentials/{cred['id']}/rotate/", {},
                                         format="json").json()["secret"])
    chosen = "chosen-by-the-client-0123456789"
    world.admin_client.post("/api/v1/webhook-credentials/", {"source": "gcp", "scheme": "token", "secret": chosen},
                            format="json")
    shown.append(chosen)
    short = "tiny-secret"
    world.admin_client.post("/api/v1/webhook-credentials/", {"source": "gcp", "scheme": "token", "secret": short},
                            format="json")
    shown.append(short)
    endpoint = world.admin_client.post("/api/v1/alert-endpoints/", {"url": "https://hooks.example.com/"},
                                       format="json").json()
    shown.append(endpoint["signing_secret"])
    shown.append(world.admin_client.post(f"/api/v1/alert-endpoints/{endpoint['id']}/rotate-secret/", {},
                                         format="json").json()["signing_secret"])
    world.admin_client.post("/api/v1/alert-endpoints/", {"url": "https://bob:pa55word-in-url@hooks.example.com/"},
                            format="json")
    shown.append("pa55word-in-url")
    logs = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.__dict__}" for r in caplog.records)
    assert caplog.records, "the requests above should have logged something (4xx warnings at least)"
    for secret in shown:
        assert secret not in logs, f"secret {secret[:6]}... reached the logs"
