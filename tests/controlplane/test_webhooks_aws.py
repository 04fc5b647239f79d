"""AWS webhooks: every EventBridge sample posted raw (API destination) and wrapped in SNS, with the
resulting rows and the state changes once the notices are drained."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.fleet.models import InterruptionNotice, NoticeKind, NoticeSource, NoticeStatus
from controlplane.fleet.services import instance_transition
from controlplane.jobs.models import JobEvent, Reconfiguration
from controlplane.orchestration.notices import notices_drain
from controlplane.webhooks import sns
from controlplane.webhooks.models import SnsSubscription
from tests.controlplane.factories import (
    make_instance,
    make_job,
    make_signing_cert,
    make_team,
    make_webhook_credential,
    sns_sign,
)

pytestmark = pytest.mark.django_db

INSTANCE_ID = "i-0b662ef9931388ba0"
SAMPLES = {
    "warning": "aws-eventbridge-spot-interruption-warning.json",
    "rebalance": "aws-eventbridge-rebalance-recommendation.json",
    "state": "aws-eventbridge-instance-state-change.json",
}
TOPIC = "arn:aws:sns:us-east-1:123456789012:spot-notices"


@pytest.fixture(autouse=True)
def _isolated(webhook_isolation):
    """No hand-off, empty credential caches (tests/controlplane/conftest.py)."""


@pytest.fixture
def samples(shared_data):
    folder = shared_data / "cloud-events"
    return {name: json.loads((folder / file).read_text()) for name, file in SAMPLES.items()}


@pytest.fixture
def team():
    return make_team("ml-team")


@pytest.fixture
def api_key(team):
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    return key


@pytest.fixture
def running_instance(team):
    job = make_job(team)
    instance = make_instance(team, provider_instance_id=INSTANCE_ID, job=job, provider="aws")
    for state in ("pending", "running"):
        instance_transition(instance=instance, to=state)
    return instance


def post_eventbridge(client, event, *, key, team_slug="ml-team", headers=None):
    return client.post(
        f"/api/v1/webhooks/aws/eventbridge/{team_slug}/", data=json.dumps(event),
        content_type="application/json", headers={"x-api-key": key, **(headers or {})},
    )


def test_each_eventbridge_sample_is_stored_once_with_its_fields(client, samples, api_key, team):
    expected = {
        "warning": (NoticeKind.INTERRUPTION, "terminate", "2026-11-20T14:04:00+00:00"),
        "rebalance": (NoticeKind.REBALANCE, "", None),
        "state": (NoticeKind.STATE_CHANGE, "shutting-down", "2026-11-20T14:04:01+00:00"),
    }
    for name, event in samples.items():
        response = post_eventbridge(client, event, key=api_key)
        assert response.status_code == 202, response.content
        assert response.json()["stored"] == 1
        notice = InterruptionNotice.objects.get(cloud_event_id=event["id"])
        kind, action, deadline = expected[name]
        assert (notice.kind, notice.action, notice.source) == (kind, action, NoticeSource.AWS_EVENTBRIDGE)
        assert notice.provider_instance_id == INSTANCE_ID
        assert notice.team == team
        assert notice.status == NoticeStatus.RECEIVED
        assert notice.dedup_key == f"{team.pk}:aws:{event['id']}"
        assert (notice.deadline.isoformat() if notice.deadline else None) == deadline
        assert notice.payload["event"] == event
    assert InterruptionNotice.objects.count() == 3


def test_samples_in_order_move_the_instance_and_reconfigure_once(client, samples, api_key, running_instance):
    for name in ("rebalance", "warning", "state"):
        assert post_eventbridge(client, samples[name], key=api_key).status_code == 202
    result = notices_drain()
    assert (result.processed, result.failed) == (3, 0)
    running_instance.refresh_from_db()
    assert running_instance.state == "preempted"
    assert list(running_instance.events.values_list("to_state", flat=True)) == [
        "pending", "running", "notice", "preempted"
    ]
    job = running_instance.job
    assert list(JobEvent.objects.filter(job=job).exclude(kind="submitted").values_list("kind", flat=True)) == [
        "instance_rebalance", "instance_interruption", "instance_state_change"
    ]
    reconf = Reconfiguration.objects.get(job=job)  # warning and state change: one leaving node
    assert reconf.trigger_key == f"leave:instance:{running_instance.pk}"
    assert reconf.decision_input["leaving_instance"]["provider_instance_id"] == INSTANCE_ID
    assert reconf.decision_input["notice"]["kind"] == "interruption"
    assert reconf.decision_input["notice"]["deadline"] == "2026-11-20T14:04:00+00:00"
    assert InterruptionNotice.objects.filter(status=NoticeStatus.PROCESSED, instance=running_instance).count() == 3


@pytest.mark.parametrize("action", ["terminate", "stop", "hibernate"])
def test_every_spot_action_moves_to_notice(client, samples, api_key, running_instance, action):
    event = copy.deepcopy(samples["warning"])
    event["detail"]["instance-action"] = action
    assert post_eventbridge(client, event, key=api_key).status_code == 202
    notices_drain()
    running_instance.refresh_from_db()
    assert running_instance.state == "notice"
    assert InterruptionNotice.objects.get().action == action


def test_duplicate_posts_store_one_row_and_act_once(client, samples, api_key, running_instance):
    first = post_eventbridge(client, samples["warning"], key=api_key)
    assert first.status_code == 202
    notices_drain()
    again = post_eventbridge(client, samples["warning"], key=api_key)
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "stored": 0, "duplicates": 1}
    notices_drain()
    assert InterruptionNotice.objects.count() == 1
    assert JobEvent.objects.filter(job=running_instance.job).exclude(kind="submitted").count() == 1
    assert running_instance.events.filter(to_state="notice").count() == 1


def test_unknown_instance_is_stored_and_flagged(client, samples, api_key):
    assert post_eventbridge(client, samples["warning"], key=api_key).status_code == 202
    notices_drain()
    notice = InterruptionNotice.objects.get()
    assert notice.unknown_instance is True
    assert notice.status == NoticeStatus.PROCESSED
    assert notice.instance is None


def test_another_teams_instance_is_not_touched(client, samples, api_key):
    other = make_team("other-team")
    theirs = make_instance(other, provider_instance_id=INSTANCE_ID, provider="aws")
    for state in ("pending", "running"):
        instance_transition(instance=theirs, to=state)
    assert post_eventbridge(client, samples["warning"], key=api_key).status_code == 202
    notices_drain()
    theirs.refresh_from_db()
    assert theirs.state == "running"
    assert InterruptionNotice.objects.get().unknown_instance is True


def test_basic_auth_connection(client, samples, team):
    make_webhook_credential(team, "aws_eventbridge", "basic", username="eventbridge", secret="s3cret-pass")
    good = base64.b64encode(b"eventbridge:s3cret-pass").decode()
    bad = base64.b64encode(b"eventbridge:wrong").decode()
    url = "/api/v1/webhooks/aws/eventbridge/ml-team/"
    body = json.dumps(samples["warning"])
    denied = client.post(url, data=body, content_type="application/json", headers={"Authorization": f"Basic {bad}"})
    assert denied.status_code == 401
    non_ascii = base64.b64encode("é:s3cret-pass".encode()).decode()  # compare_digest refuses such a str
    stranger = client.post(url, data=body, content_type="application/json",
                           headers={"Authorization": f"Basic {non_ascii}"})
    assert stranger.status_code == 401 and "invalid credentials" in stranger.json()["detail"]
    assert InterruptionNotice.objects.count() == 0
    ok = client.post(url, data=body, content_type="application/json", headers={"Authorization": f"Basic {good}"})
    assert ok.status_code == 202


def test_rotated_api_key_overlaps_then_expires(client, samples, team, api_key):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.webhooks.credentials import credential_rotate
    from controlplane.webhooks.models import WebhookCredential

    old = WebhookCredential.objects.get(team=team)
    _, new_key = credential_rotate(credential=old, overlap=timedelta(hours=1))
    event = copy.deepcopy(samples["warning"])
    assert post_eventbridge(client, event, key=api_key).status_code == 202  # old still valid
    event["id"] = "second"
    assert post_eventbridge(client, event, key=new_key).status_code == 202
    old.expires_at = timezone.now() - timedelta(seconds=1)
    old.save()
    event["id"] = "third"
    assert post_eventbridge(client, event, key=api_key).status_code == 401
    assert WebhookCredential.objects.get(pk=old.pk).secret_hash != api_key  # only a hash is kept


# --- SNS ----------------------------------------------------------------------------------------


class _LocalAws:
    """A loopback HTTP server standing in for SNS: serves the signing certificate and records
    SubscribeURL GETs."""

    def __init__(self, cert_pem: bytes) -> None:
        self.cert_pem = cert_pem
        self.gets: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.gets.append(self.path)
                body = outer.cert_pem if self.path.endswith(".pem") else b"<ConfirmSubscriptionResponse/>"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def signing_key():
    return make_signing_cert()


@pytest.fixture
def local_aws(signing_key, settings):
    server = _LocalAws(signing_key[1])
    # The allowed host pattern and plain HTTP are configured for the loopback server only.
    settings.SPOTPIPE_SNS_CERT_HOST_PATTERN = r"^127\.0\.0\.1$"
    settings.SPOTPIPE_SNS_ALLOW_HTTP = True
    yield server
    server.close()


@pytest.fixture
def sns_topic(team):
    make_webhook_credential(team, "aws_sns", "sns_topic", topic_arn=TOPIC)


def _now_iso() -> str:
    """SNS's Timestamp format; messages must be fresh (the replay window)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def sns_message(local_aws, key, type_: str, *, version="1", **fields) -> dict:
    message = {
        "Type": type_, "MessageId": fields.pop("MessageId", "0a1b2c3d-msg"), "TopicArn": TOPIC,
        "Timestamp": fields.pop("Timestamp", _now_iso()),
        "SigningCertURL": f"{local_aws.base}/SimpleNotificationService-1.pem",
        **fields,
    }
    if type_ != "Notification":
        message.setdefault("Token", "2336412f37fb687f5d51e6e2425f004a")
        message.setdefault("SubscribeURL", f"{local_aws.base}/?Action=ConfirmSubscription&Token=abc")
        message.setdefault("Message", "You have chosen to subscribe to the topic.")
    return sns_sign(message, key, version=version)


def post_sns(client, message, *, header_type=None):
    return client.post(
        "/api/v1/webhooks/aws/sns/ml-team/", data=json.dumps(message), content_type="text/plain; charset=UTF-8",
        headers={"x-amz-sns-message-type": header_type or message["Type"]},
    )


@pytest.mark.parametrize("version", ["1", "2"])
def test_sns_wrapped_samples_are_verified_stored_and_processed(
    client, samples, local_aws, signing_key, sns_topic, running_instance, version
):
    key = signing_key[0]
    for i, name in enumerate(("rebalance", "warning", "state")):
        message = sns_message(local_aws, key, "Notification", version=version, MessageId=f"msg-{i}",
                              Message=json.dumps(samples[name]), Subject="spot")
        response = post_sns(client, message)
        assert response.status_code == 202, response.content
    assert set(InterruptionNotice.objects.values_list("source", flat=True)) == {NoticeSource.AWS_SNS}
    assert InterruptionNotice.objects.get(kind="interruption").payload["meta"]["sns_message_id"] == "msg-1"
    assert local_aws.gets == ["/SimpleNotificationService-1.pem"]  # fetched once, then cached
    notices_drain()
    running_instance.refresh_from_db()
    assert running_instance.state == "preempted"
    assert Reconfiguration.objects.filter(job=running_instance.job).count() == 1


def test_same_event_via_eventbridge_and_sns_is_one_notice(client, samples, local_aws, signing_key, sns_topic,
                                                          api_key):
    assert post_eventbridge(client, samples["warning"], key=api_key).status_code == 202
    message = sns_message(local_aws, signing_key[0], "Notification", Message=json.dumps(samples["warning"]))
    response = post_sns(client, message)
    assert response.status_code == 200
    assert response.json()["status"] == "duplicate"
    assert InterruptionNotice.objects.count() == 1


def test_sns_subscription_confirmation_gets_the_subscribe_url(client, local_aws, signing_key, sns_topic, team):
    message = sns_message(local_aws, signing_key[0], "SubscriptionConfirmation", version="2")
    response = post_sns(client, message)
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "confirmed"}
    assert "/?Action=ConfirmSubscription&Token=abc" in local_aws.gets
    sub = SnsSubscription.objects.get(team=team, topic_arn=TOPIC)
    assert sub.status == "confirmed" and sub.confirmed_at is not None
    unsub = sns_message(local_aws, signing_key[0], "UnsubscribeConfirmation", MessageId="unsub-1")
    assert post_sns(client, unsub).status_code == 200
    sub.refresh_from_db()
    assert sub.status == "unsubscribed"
    assert InterruptionNotice.objects.count() == 0


def test_sns_topic_not_allowed_is_refused_without_confirming(client, local_aws, signing_key, sns_topic):
    message = sns_message(local_aws, signing_key[0], "SubscriptionConfirmation",
                          TopicArn="arn:aws:sns:us-east-1:999999999999:someone-else")
    response = post_sns(client, message)
    assert response.status_code == 403
    assert "TopicArn" in response.json()["errors"]
    assert local_aws.gets == []
    assert SnsSubscription.objects.count() == 0


def test_sns_forged_message_is_refused(client, samples, local_aws, signing_key, sns_topic):
    message = sns_message(local_aws, signing_key[0], "Notification", Message=json.dumps(samples["warning"]))
    forged = copy.deepcopy(samples["warning"])
    forged["detail"]["instance-id"] = "i-0someoneelse"
    message["Message"] = json.dumps(forged)
    response = post_sns(client, message)
    assert response.status_code == 401
    assert "does not verify" in response.json()["detail"]
    assert InterruptionNotice.objects.count() == 0


def test_sns_signed_by_another_key_is_refused(client, samples, local_aws, sns_topic):
    other_key, _ = make_signing_cert()
    message = sns_message(local_aws, other_key, "Notification", Message=json.dumps(samples["warning"]))
    assert post_sns(client, message).status_code == 401
    assert InterruptionNotice.objects.count() == 0


def test_sns_certificate_from_a_disallowed_host_is_not_fetched(client, samples, local_aws, signing_key, sns_topic,
                                                                settings):
    settings.SPOTPIPE_SNS_CERT_HOST_PATTERN = r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$"
    message = sns_message(local_aws, signing_key[0], "Notification", Message=json.dumps(samples["warning"]))
    response = post_sns(client, message)
    assert response.status_code == 401
    assert response.json()["errors"] == {"SigningCertURL": ["SigningCertURL host '127.0.0.1' is not an allowed "
                                                             "SNS host"]}
    assert local_aws.gets == []
    assert InterruptionNotice.objects.count() == 0


def test_sns_default_pattern_accepts_aws_hosts_only():
    pattern_ok = ["https://sns.us-east-1.amazonaws.com/x.pem", "https://sns.cn-north-1.amazonaws.com.cn/x.pem"]
    for url in pattern_ok:
        assert sns.check_aws_url(url, field="SigningCertURL") == url
    for url in ["https://sns.us-east-1.amazonaws.com.evil.io/x.pem", "http://sns.us-east-1.amazonaws.com/x.pem",
                "https://evil.io/sns.us-east-1.amazonaws.com/x.pem"]:
        with pytest.raises(sns.SnsError):
            sns.check_aws_url(url, field="SigningCertURL")


def test_sns_header_type_must_match_body(client, local_aws, signing_key, sns_topic, samples):
    message = sns_message(local_aws, signing_key[0], "Notification", Message=json.dumps(samples["warning"]))
    response = post_sns(client, message, header_type="SubscriptionConfirmation")
    assert response.status_code == 400
    assert InterruptionNotice.objects.count() == 0
