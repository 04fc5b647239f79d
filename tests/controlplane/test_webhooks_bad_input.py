"""Every kind of bad input gets the right 4xx with a message naming the problem, is logged, and
leaves no row behind."""

from __future__ import annotations

import copy
import json
import logging
import time

import pytest

from controlplane.fleet.models import InterruptionNotice
from controlplane.webhooks import signing
from controlplane.webhooks.views import MAX_BODY_BYTES
from tests.controlplane.factories import make_team, make_webhook_credential

pytestmark = pytest.mark.django_db
EB = "/api/v1/webhooks/aws/eventbridge/ml-team/"
NOTICE = "/api/v1/webhooks/notice/ml-team/"


@pytest.fixture(autouse=True)
def _isolated(webhook_isolation):
    """No hand-off, empty credential caches (tests/controlplane/conftest.py)."""


@pytest.fixture
def creds():
    team = make_team("ml-team")
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    _, secret = make_webhook_credential(team, "generic", "standard_webhooks")
    return {"key": key, "secret": secret}


def check(response, status: int, field: str, words: str, caplog) -> None:
    assert response.status_code == status, response.content
    data = response.json()
    assert words in data["detail"], data
    assert field in data["errors"], data
    assert InterruptionNotice.objects.count() == 0
    assert any(r.levelno == logging.WARNING and "rejected" in r.getMessage() for r in caplog.records)


def post(client, url, body, *, key=None, content_type="application/json", headers=None):
    h = dict(headers or {})
    if key:
        h["x-api-key"] = key
    return client.post(url, data=body, content_type=content_type, headers=h)


def test_malformed_json(client, creds, caplog):
    check(post(client, EB, b'{"version": "0", "id":', key=creds["key"]), 400, "body", "malformed JSON", caplog)


def test_json_that_is_not_an_object(client, creds, caplog):
    check(post(client, EB, b"[1, 2]", key=creds["key"]), 400, "body", "must be a JSON object", caplog)


def test_wrong_content_type(client, creds, warning, caplog):
    response = post(client, EB, json.dumps(warning), key=creds["key"], content_type="application/x-www-form-urlencoded")
    check(response, 415, "Content-Type", "not accepted", caplog)


def test_body_over_one_mebibyte(client, creds, warning, caplog):
    big = copy.deepcopy(warning)
    big["detail"]["padding"] = "x" * MAX_BODY_BYTES
    check(post(client, EB, json.dumps(big), key=creds["key"]), 413, "body", "over the 1048576-byte limit", caplog)


def test_empty_body(client, creds, caplog):
    check(post(client, EB, b"", key=creds["key"]), 400, "body", "empty body", caplog)


@pytest.mark.parametrize(
    ("path", "field"),
    [(("id",), "id"), (("detail", "instance-id"), "detail.instance-id"), (("detail",), "detail"),
     (("time",), "time"), (("detail", "instance-action"), "detail.instance-action")],
)
def test_missing_fields(client, creds, warning, caplog, path, field):
    event = copy.deepcopy(warning)
    target = event
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    check(post(client, EB, json.dumps(event), key=creds["key"]), 400, field, field, caplog)


def test_bad_spot_action(client, creds, warning, caplog):
    event = copy.deepcopy(warning)
    event["detail"]["instance-action"] = "explode"
    check(post(client, EB, json.dumps(event), key=creds["key"]), 400, "detail.instance-action", "explode", caplog)


def test_unknown_detail_type(client, creds, warning, caplog):
    event = {**warning, "detail-type": "EC2 Fleet Error"}
    check(post(client, EB, json.dumps(event), key=creds["key"]), 400, "detail-type", "unsupported detail-type",
          caplog)


def test_missing_auth(client, creds, warning, caplog):
    check(post(client, EB, json.dumps(warning)), 401, "Authorization", "missing credentials", caplog)


def test_bad_api_key(client, creds, warning, caplog):
    check(post(client, EB, json.dumps(warning), key="sp_wh_wrong"), 401, "Authorization", "invalid credentials",
          caplog)


def test_unknown_team(client, creds, warning, caplog):
    response = post(client, "/api/v1/webhooks/aws/eventbridge/nobody/", json.dumps(warning), key=creds["key"])
    check(response, 401, "team", "no aws_eventbridge webhook credentials", caplog)


def test_get_is_not_allowed(client, creds, caplog):
    response = client.get(EB)
    assert response.status_code == 405
    assert response["Allow"] == "POST"


def _generic_body() -> bytes:
    return json.dumps({"instance_id": "i-1", "action": "terminate"}).encode()


def test_missing_signature_headers(client, creds, caplog):
    check(post(client, NOTICE, _generic_body()), 401, "webhook-signature", "missing webhook-id", caplog)


def test_stale_timestamp(client, creds, caplog):
    body = _generic_body()
    headers = signing.signed_headers(secret=creds["secret"], msg_id="m1", body=body,
                                     timestamp=int(time.time()) - 3600)
    check(post(client, NOTICE, body, headers=headers), 401, "webhook-signature", "tolerance", caplog)


def test_forged_signature(client, creds, caplog):
    body = _generic_body()
    headers = signing.signed_headers(secret=signing.generate_secret(), msg_id="m1", body=body)
    check(post(client, NOTICE, body, headers=headers), 401, "webhook-signature", "does not match", caplog)


def test_non_ascii_signature(client, creds, caplog):
    body = _generic_body()
    headers = {**signing.signed_headers(secret=creds["secret"], msg_id="m1", body=body), "webhook-signature": "v1,é"}
    check(post(client, NOTICE, body, headers=headers), 401, "webhook-signature", "does not match", caplog)


def test_tampered_body(client, creds, caplog):
    body = _generic_body()
    headers = signing.signed_headers(secret=creds["secret"], msg_id="m1", body=body)
    tampered = body.replace(b"i-1", b"i-2")
    check(post(client, NOTICE, tampered, headers=headers), 401, "webhook-signature", "does not match", caplog)


def test_generic_bad_action(client, creds, caplog):
    body = json.dumps({"instance_id": "i-1", "action": "nap"}).encode()
    headers = signing.signed_headers(secret=creds["secret"], msg_id="m1", body=body)
    check(post(client, NOTICE, body, headers=headers), 400, "action", "'nap'", caplog)


def test_gcp_bad_base64_and_wrong_method(client, caplog):
    team = make_team("gcp-team")
    _, token = make_webhook_credential(team, "gcp", "token")
    url = f"/api/v1/webhooks/gcp/gcp-team/?token={token}"
    check(post(client, url, json.dumps({"message": {"data": "%%%"}})), 400, "message.data", "base64", caplog)
    import base64

    entry = {"protoPayload": {"methodName": "v1.compute.instances.stop"}}
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    check(post(client, url, json.dumps({"message": {"data": data}})), 400, "protoPayload.methodName",
          "compute.instances.preempted", caplog)
    check(post(client, url.replace(token, "nope"), json.dumps({"message": {"data": data}})), 401, "token",
          "invalid token", caplog)
