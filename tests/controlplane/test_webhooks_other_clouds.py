"""GCP Pub/Sub push (shared token and OIDC), forwarded Azure scheduled events and generic signed
notices (Standard Webhooks), from the reference samples to rows and state changes."""

from __future__ import annotations

import base64
import json
import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from controlplane.fleet.models import InterruptionNotice, NoticeKind, NoticeSource
from controlplane.fleet.services import instance_transition
from controlplane.jobs.models import JobEvent, Reconfiguration
from controlplane.orchestration.notices import notices_drain
from controlplane.webhooks import oidc, signing
from controlplane.webhooks.credentials import credential_rotate, credentials_cache_clear
from controlplane.webhooks.models import WebhookCredential
from tests.controlplane.factories import make_instance, make_job, make_team, make_webhook_credential

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _isolated(webhook_isolation):
    """No hand-off, empty credential caches (tests/controlplane/conftest.py)."""


@pytest.fixture
def team():
    return make_team("ml-team")


def running(team, provider_instance_id, **kw):
    instance = make_instance(team, provider_instance_id=provider_instance_id, job=make_job(team), **kw)
    for state in ("pending", "running"):
        instance_transition(instance=instance, to=state)
    return instance


# --- GCP --------------------------------------------------------------------------------------------


@pytest.fixture
def gcp_entry(shared_data):
    return json.loads((shared_data / "cloud-events" / "gcp-audit-log-instance-preempted.json").read_text())


def push_envelope(entry: dict, message_id: str = "9001") -> dict:
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    return {"message": {"data": data, "messageId": message_id, "publishTime": "2026-11-20T14:03:31.2Z"},
            "subscription": "projects/my-project/subscriptions/spotpipe-preempted"}


def test_gcp_push_with_shared_token_preempts_the_instance(client, team, gcp_entry):
    _, token = make_webhook_credential(team, "gcp", "token")
    instance = running(team, "8453216590212345678")
    url = f"/api/v1/webhooks/gcp/ml-team/?token={token}"
    response = client.post(url, data=json.dumps(push_envelope(gcp_entry)), content_type="application/json")
    assert response.status_code == 202, response.content
    # Pub/Sub redelivers with another messageId: the log entry's insertId keeps it one notice.
    again = client.post(url, data=json.dumps(push_envelope(gcp_entry, "9002")), content_type="application/json")
    assert again.status_code == 200
    notice = InterruptionNotice.objects.get()
    assert (notice.source, notice.kind, notice.cloud_event_id) == (NoticeSource.GCP, NoticeKind.PREEMPTED,
                                                                   "-x0boqfe25xye")
    assert notice.payload["meta"]["instance_name"] == "trainer-7"
    notices_drain()
    instance.refresh_from_db()
    assert instance.state == "preempted"
    reconf = Reconfiguration.objects.get(job=instance.job)
    assert reconf.decision_input["lead_time_s"] < 0  # already gone: no time left
    assert JobEvent.objects.exclude(kind="submitted").get(job=instance.job).kind == "instance_preempted"


def test_gcp_instance_found_by_name(client, team, gcp_entry):
    _, token = make_webhook_credential(team, "gcp", "token")
    instance = running(team, "trainer-7")
    client.post("/api/v1/webhooks/gcp/ml-team/", data=json.dumps(push_envelope(gcp_entry)),
                content_type="application/json", headers={"X-Spotpipe-Token": token})
    notices_drain()
    instance.refresh_from_db()
    assert instance.state == "preempted"


def _jwt(key, claims: dict, kid: str = "k1") -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "RS256", "kid": kid, "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{b64(sig)}"


def test_gcp_push_with_oidc_token(client, team, gcp_entry):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    audience = "https://spotpipe.example/api/v1/webhooks/gcp/ml-team/"
    email = "pusher@my-project.iam.gserviceaccount.com"
    make_webhook_credential(team, "gcp", "oidc", config={"audience": audience, "email": email,
                                                         "public_keys": {"k1": pem}})
    claims = {"iss": "https://accounts.google.com", "aud": audience, "email": email, "email_verified": True,
              "exp": int(time.time()) + 600, "iat": int(time.time())}
    url = "/api/v1/webhooks/gcp/ml-team/"
    body = json.dumps(push_envelope(gcp_entry))
    ok = client.post(url, data=body, content_type="application/json",
                     headers={"Authorization": f"Bearer {_jwt(key, claims)}"})
    assert ok.status_code == 202, ok.content
    InterruptionNotice.objects.all().delete()
    for bad in ({**claims, "aud": "https://elsewhere"}, {**claims, "exp": int(time.time()) - 3600},
                {**claims, "email": "intruder@evil.iam.gserviceaccount.com"}):
        denied = client.post(url, data=body, content_type="application/json",
                             headers={"Authorization": f"Bearer {_jwt(key, bad)}"})
        assert denied.status_code == 401
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = client.post(url, data=body, content_type="application/json",
                         headers={"Authorization": f"Bearer {_jwt(other, claims)}"})
    assert forged.status_code == 401
    assert "signature" in forged.json()["detail"]
    assert InterruptionNotice.objects.count() == 0


def test_gcp_oidc_requires_the_service_account_email(client, team, gcp_entry):
    """Without a configured email any Google-signed token for the audience would pass, whoever's
    account made it: such a credential cannot be created, and one stored earlier accepts nobody."""
    from controlplane.common.errors import DomainError

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    audience = "https://spotpipe.example/api/v1/webhooks/gcp/ml-team/"
    with pytest.raises(DomainError, match=r"config\.email"):
        make_webhook_credential(team, "gcp", "oidc", config={"audience": audience, "public_keys": {"k1": pem}})
    WebhookCredential.objects.create(team=team, source="gcp", scheme="oidc", name="from before",
                                     config={"audience": audience, "public_keys": {"k1": pem}})
    credentials_cache_clear()
    claims = {"iss": "https://accounts.google.com", "aud": audience, "email": "anyone@other.iam.gserviceaccount.com",
              "email_verified": True, "exp": int(time.time()) + 600, "iat": int(time.time())}
    denied = client.post("/api/v1/webhooks/gcp/ml-team/", data=json.dumps(push_envelope(gcp_entry)),
                         content_type="application/json", headers={"Authorization": f"Bearer {_jwt(key, claims)}"})
    assert denied.status_code == 401 and "email" in denied.json()["detail"]
    assert InterruptionNotice.objects.count() == 0


class _GoogleKeys:
    """A real HTTP server on loopback serving a JWKS document the way Google's certs endpoint does;
    `keys` can be swapped (a rotation) and `fetches` counts requests (the cache)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                from jwt.algorithms import RSAAlgorithm

                outer.fetches += 1
                jwks = {"keys": [{**json.loads(RSAAlgorithm.to_jwk(k.public_key())), "kid": kid, "alg": "RS256",
                                  "use": "sig"} for kid, k in outer.keys.items()]}
                body = json.dumps(jwks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/v3/certs"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def google_keys(settings):
    keys = _GoogleKeys()
    settings.SPOTPIPE_GCP_OIDC_JWKS_URL = keys.url
    yield keys
    keys.server.shutdown()


def test_gcp_oidc_uses_googles_published_keys_and_follows_a_rotation(client, team, gcp_entry, google_keys,
                                                                     monkeypatch):
    """No keys on the credential: they come from the JWKS endpoint, fetched once and cached; a token
    signed with a key Google rotated in since is accepted after one more fetch, with no change to the
    credential. Unknown key ids fetch again at most once per cooldown."""
    monkeypatch.setattr(oidc, "JWKS_REFRESH_COOLDOWN_S", 0.2)
    audience = "https://spotpipe.example/api/v1/webhooks/gcp/ml-team/"
    email = "pusher@my-project.iam.gserviceaccount.com"
    make_webhook_credential(team, "gcp", "oidc", config={"audience": audience, "email": email})
    claims = {"iss": "https://accounts.google.com", "aud": audience, "email": email, "email_verified": True,
              "exp": int(time.time()) + 600, "iat": int(time.time())}
    url = "/api/v1/webhooks/gcp/ml-team/"
    old = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    google_keys.keys = {"old": old}

    def push(key, kid: str, message_id: str):
        return client.post(url, data=json.dumps(push_envelope(gcp_entry, message_id)),
                           content_type="application/json",
                           headers={"Authorization": f"Bearer {_jwt(key, claims, kid=kid)}"})

    assert push(old, "old", "1").status_code == 202
    assert push(old, "old", "2").status_code == 200  # the same log entry again: a duplicate, not a refusal
    assert google_keys.fetches == 1
    new = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    google_keys.keys = {"new": new}  # Google rotated: the old key is gone from the document
    time.sleep(0.3)
    assert push(new, "new", "3").status_code == 200
    assert google_keys.fetches == 2
    forged = push(rsa.generate_private_key(public_exponent=65537, key_size=2048), "new", "4")
    assert forged.status_code == 401 and "signature" in forged.json()["detail"]
    oidc._jwks_client(google_keys.url).cooldown_duration = 3600  # the flood below all falls within it
    for attempt in range(5):  # a flood of made-up key ids within the cooldown: no fetch each
        unknown = push(new, f"never-published-{attempt}", str(5 + attempt))
        assert unknown.status_code == 401 and "signing key" in unknown.json()["detail"]
    assert google_keys.fetches == 2
    assert InterruptionNotice.objects.count() == 1


def test_gcp_oidc_keys_unreachable_is_a_503_so_pubsub_retries(client, team, gcp_entry, settings):
    """Google's keys cannot be fetched: the token was not judged, so the answer is not a 401 (which
    would read as a bad credential) but a 503 that Pub/Sub retries; nothing is stored."""
    settings.SPOTPIPE_GCP_OIDC_JWKS_URL = "http://127.0.0.1:9/certs"  # discard port: connection refused
    audience = "https://spotpipe.example/api/v1/webhooks/gcp/ml-team/"
    email = "pusher@my-project.iam.gserviceaccount.com"
    make_webhook_credential(team, "gcp", "oidc", config={"audience": audience, "email": email})
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"iss": "https://accounts.google.com", "aud": audience, "email": email, "email_verified": True,
              "exp": int(time.time()) + 600}
    response = client.post("/api/v1/webhooks/gcp/ml-team/", data=json.dumps(push_envelope(gcp_entry)),
                           content_type="application/json", headers={"Authorization": f"Bearer {_jwt(key, claims)}"})
    assert response.status_code == 503, response.content
    assert "could not be fetched" in response.json()["detail"]
    assert InterruptionNotice.objects.count() == 0


# --- Azure and generic (Standard Webhooks) --------------------------------------------------------


def signed_post(client, path: str, body: bytes, secret: str, *, msg_id: str = "msg_1", timestamp=None):
    headers = signing.signed_headers(secret=secret, msg_id=msg_id, body=body, timestamp=timestamp)
    return client.post(path, data=body, content_type="application/json", headers=headers)


def test_azure_preempt_document(client, team, shared_data):
    _, secret = make_webhook_credential(team, "azure", "standard_webhooks")
    instance = running(team, "vm-spot-3")
    body = (shared_data / "cloud-events" / "azure-scheduled-events-preempt.json").read_bytes()
    assert signed_post(client, "/api/v1/webhooks/azure/ml-team/", body, secret).status_code == 202
    # The same document forwarded by another node's agent, with its own webhook-id: still one notice.
    assert signed_post(client, "/api/v1/webhooks/azure/ml-team/", body, secret, msg_id="msg_2").status_code == 200
    notice = InterruptionNotice.objects.get()
    assert (notice.source, notice.kind, notice.action) == (NoticeSource.AZURE, NoticeKind.INTERRUPTION, "preempt")
    assert notice.deadline.isoformat() == "2026-11-20T14:04:32+00:00"
    notices_drain()
    instance.refresh_from_db()
    assert instance.state == "notice"
    assert Reconfiguration.objects.get(job=instance.job).decision_input["notice"]["source"] == "azure"


def test_generic_notice_from_an_agent(client, team):
    _, secret = make_webhook_credential(team, "generic", "standard_webhooks")
    instance = running(team, "i-0agent")
    body = json.dumps({"instance_id": "i-0agent", "action": "terminate", "time": "2026-11-20T14:02:00Z",
                       "deadline": "2026-11-20T14:04:00Z", "source": "agent"}).encode()
    assert signed_post(client, "/api/v1/webhooks/notice/ml-team/", body, secret).status_code == 202
    assert signed_post(client, "/api/v1/webhooks/notice/ml-team/", body, secret).status_code == 200
    notice = InterruptionNotice.objects.get()
    assert (notice.source, notice.dedup_key) == (NoticeSource.AGENT, f"{team.pk}:generic:msg_1")
    notices_drain()
    instance.refresh_from_db()
    assert instance.state == "notice"


def test_rotating_signing_secrets(client, team):
    cred, old = make_webhook_credential(team, "generic", "standard_webhooks")
    new_cred, new = credential_rotate(credential=cred)
    body = json.dumps({"instance_id": "i-1", "action": "rebalance"}).encode()
    # During the overlap a sender may sign with either, or both (space-separated signatures).
    assert signed_post(client, "/api/v1/webhooks/notice/ml-team/", body, old, msg_id="a").status_code == 202
    assert signed_post(client, "/api/v1/webhooks/notice/ml-team/", body, new, msg_id="b").status_code == 202
    WebhookCredential.objects.filter(pk=cred.pk).update(revoked_at=new_cred.created_at)
    credentials_cache_clear()
    denied = signed_post(client, "/api/v1/webhooks/notice/ml-team/", body, old, msg_id="c")
    assert denied.status_code == 401
    assert InterruptionNotice.objects.count() == 2


def test_agent_forwards_the_imds_samples(client, team, shared_data):
    """The metadata bodies an agent reads on the VM (spot/instance-action, rebalance), forwarded raw."""
    _, secret = make_webhook_credential(team, "generic", "standard_webhooks")
    instance = running(team, "i-0imds")
    folder = shared_data / "cloud-events"
    rebalance = json.loads((folder / "aws-imds-rebalance.json").read_text())
    action = json.loads((folder / "aws-imds-spot-instance-action.json").read_text())
    for msg_id, imds in (("imds-r", rebalance), ("imds-a", action)):
        body = json.dumps({"instance_id": "i-0imds", "imds": imds, "source": "agent"}).encode()
        assert signed_post(client, "/api/v1/webhooks/notice/ml-team/", body, secret, msg_id=msg_id).status_code == 202
    warning = InterruptionNotice.objects.get(cloud_event_id="imds-a")
    assert (warning.kind, warning.action, warning.source) == (NoticeKind.INTERRUPTION, "terminate", NoticeSource.AGENT)
    assert warning.deadline.isoformat() == "2026-11-20T14:04:00+00:00"
    assert InterruptionNotice.objects.get(cloud_event_id="imds-r").kind == NoticeKind.REBALANCE
    notices_drain()
    instance.refresh_from_db()
    assert instance.state == "notice"
    bad = json.dumps({"instance_id": "i-0imds", "imds": {"action": "melt", "time": "2026-11-20T14:04:00Z"}}).encode()
    response = signed_post(client, "/api/v1/webhooks/notice/ml-team/", bad, secret, msg_id="imds-bad")
    assert response.status_code == 400 and "imds.action" in response.json()["errors"]


def test_management_command_prints_the_secret_once(team):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("webhook_credential", "ml-team", "gcp", "token", stdout=out)
    secret = out.getvalue().split("secret (shown once): ")[1].strip()
    cred = WebhookCredential.objects.get(team=team, source="gcp")
    assert cred.secret_hash and secret not in cred.secret_hash
    from controlplane.webhooks.credentials import hash_secret

    assert cred.secret_hash == hash_secret(secret)
