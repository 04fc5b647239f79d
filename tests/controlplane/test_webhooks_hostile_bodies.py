"""Hostile webhook bodies (issue 21): values longer than their columns, characters PostgreSQL
refuses (NUL, in a stored field or anywhere in the JSON payload) and a small body nested thousands
deep each get a 400 naming the field on both databases, never a 500 (which EventBridge would retry
for 24 hours) and never a row stored on one database and refused on the other."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC

import pytest

from controlplane.fleet.models import InterruptionNotice
from controlplane.webhooks import formats, signing
from tests.controlplane.factories import make_team, make_webhook_credential

pytestmark = pytest.mark.django_db
EB = "/api/v1/webhooks/aws/eventbridge/ml-team/"
AZURE = "/api/v1/webhooks/azure/ml-team/"
NOTICE = "/api/v1/webhooks/notice/ml-team/"


@pytest.fixture(autouse=True)
def _isolated(webhook_isolation):
    """No hand-off, empty credential caches (tests/controlplane/conftest.py)."""


@pytest.fixture
def creds():
    team = make_team("ml-team")
    _, key = make_webhook_credential(team, "aws_eventbridge", "api_key", header_name="x-api-key")
    _, secret = make_webhook_credential(team, "generic", "standard_webhooks")
    _, azure = make_webhook_credential(team, "azure", "standard_webhooks")
    return {"key": key, "secret": secret, "azure": azure}


def _eb(client, creds, body):
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(EB, data=data, content_type="application/json", headers={"x-api-key": creds["key"]})


def _signed(client, url, secret, body: dict, msg_id: str = "msg_hostile"):
    raw = json.dumps(body).encode()
    headers = signing.signed_headers(secret=secret, msg_id=msg_id, body=raw)
    return client.post(url, data=raw, content_type="application/json", headers=headers)


def _refused(response, field: str, words: str) -> None:
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert words in response.json()["detail"]
    assert InterruptionNotice.objects.count() == 0


def test_a_small_deeply_nested_body_is_a_400(client, creds):
    depth = 20000  # 40 kB, far past the parser's recursion limit
    _refused(_eb(client, creds, b"[" * depth + b"]" * depth), "body", "nested too deeply")


def test_nul_in_a_stored_field_is_a_400(client, creds, warning):
    event = copy.deepcopy(warning)
    event["detail"]["instance-id"] = "i-0123456789abcdef0\u0000"
    _refused(_eb(client, creds, event), "detail.instance-id", "NUL")


def test_nul_anywhere_in_the_payload_is_a_400(client, creds, warning):
    event = copy.deepcopy(warning)
    event["detail"]["note"] = "harmless\u0000text"
    _refused(_eb(client, creds, event), "detail.note", "NUL")


@pytest.mark.parametrize("where", ["instance-id", "note"])
def test_a_lone_surrogate_is_a_400(client, creds, warning, where):
    """json.dumps writes "\\ud800" as an escape: it parses to a str no encoder takes (PostgreSQL's
    jsonb refuses it; on SQLite the stored notice failed every later read of the notices)."""
    event = copy.deepcopy(warning)
    event["detail"][where] = "i-0123456789abcdef0\ud800"
    _refused(_eb(client, creds, event), f"detail.{where}", "lone surrogate")


def test_a_body_nested_deeper_than_a_store_encodes_is_a_400(client, creds, warning):
    """900 levels parse, but encoding them for jsonb recursed past the stack on PostgreSQL."""
    event = copy.deepcopy(warning)
    event["detail"]["note"] = json.loads("[" * 900 + "]" * 900)
    response = _eb(client, creds, event)
    [field] = response.json()["errors"]
    assert field.startswith("detail.note[0][0]") and field.endswith("...") and len(field) == 63
    _refused(response, field, "nested more than 64 levels")


@pytest.mark.parametrize(("where", "value", "field"), [
    ("instance-id", "i-" + "0" * 120, "detail.instance-id"),
    ("id", "e" * 500, "id"),
])
def test_values_longer_than_their_columns_are_a_400(client, creds, warning, where, value, field):
    event = copy.deepcopy(warning)
    if where == "id":
        event["id"] = value
    else:
        event["detail"][where] = value
    _refused(_eb(client, creds, event), field, "longer than")


def test_a_long_state_is_a_400(client, creds, shared_data):
    state = json.loads((shared_data / "cloud-events" / "aws-eventbridge-instance-state-change.json").read_text())
    state["detail"]["state"] = "shutting-down-" * 10
    _refused(_eb(client, creds, state), "detail.state", "longer than 20")


def test_control_characters_in_an_id_are_a_400(client, creds, warning):
    event = copy.deepcopy(warning)
    event["detail"]["instance-id"] = "i-0123\n456789abcdef0"
    _refused(_eb(client, creds, event), "detail.instance-id", "control characters")


def test_generic_notice_bounds(client, creds):
    body = {"instance_id": "x" * 101, "action": "terminate"}
    _refused(_signed(client, NOTICE, creds["secret"], body), "instance_id", "longer than 100")
    body = {"instance_id": "i-1", "action": "terminate"}
    _refused(_signed(client, NOTICE, creds["secret"], body, msg_id="m" * 200), "webhook-id", "longer than")


def test_azure_resource_names_are_bounded(client, creds):
    body = {"DocumentIncarnation": 1, "Events": [{"EventId": "A1B2", "EventType": "Preempt",
                                                  "Resources": ["vm" * 100], "NotBefore": ""}]}
    _refused(_signed(client, AZURE, creds["azure"], body), "Events[0].Resources[0]", "longer than")


def test_gcp_message_data_is_checked_after_decoding():
    entry = {"protoPayload": {"methodName": "compute.instances.preempted"}, "insertId": "ins-1",
             "timestamp": "2026-11-20T10:00:00Z", "resource": {"labels": {"instance_id": "1\u00002"}}}
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    with pytest.raises(formats.BadNotice) as refused:
        formats.gcp_push_drafts({"message": {"data": data}}, team_id=1)
    assert "NUL" in refused.value.message


# --- Notice times: one rule (formats._time) for every format -------------------------------------


@pytest.mark.parametrize("when", [
    "9999-12-31T23:59:00Z",  # + the 2-minute lead overflowed (a 500, retried for 24 hours)
    "9999-12-31T23:00:00-05:00",  # past year 9999 in UTC
    "0001-01-01T00:00:00+05:00",  # before year 1 in UTC
    "1999-12-31T23:59:59Z",  # fits, but no notice is that old
])
def test_an_eventbridge_time_out_of_range_is_a_400(client, creds, warning, when):
    _refused(_eb(client, creds, {**warning, "time": when}), "time", "must be a time in the years 2000-2999")


def test_a_time_in_those_years_is_stored_in_utc(client, creds, warning):
    """The years are the sender's, as the schema's pattern states them: 2000-01-01 at +05:00 is
    1999 in UTC and accepted."""
    assert _eb(client, creds, {**warning, "time": "2000-01-01T00:00:00+05:00"}).status_code == 202
    assert InterruptionNotice.objects.get().event_time.isoformat() == "1999-12-31T19:00:00+00:00"


@pytest.mark.parametrize(("body", "field"), [
    ({"imds": {"action": "terminate", "time": "0001-01-01T00:01:00Z"}}, "imds.time"),  # - the lead overflowed
    ({"imds": {"noticeTime": "9999-12-31T23:00:00-05:00"}}, "imds.noticeTime"),
    ({"action": "terminate", "time": "0001-01-01T00:00:00+05:00"}, "time"),
    ({"action": "terminate", "deadline": "9999-12-31T23:00:00-05:00"}, "deadline"),
    ({"action": "terminate", "deadline": "3000-01-01T00:00:00Z"}, "deadline"),
])
def test_a_generic_time_out_of_range_is_a_400(client, creds, body, field):
    response = _signed(client, NOTICE, creds["secret"], {"instance_id": "i-1", **body})
    _refused(response, field, "must be a time in the years 2000-2999")


@pytest.mark.parametrize(("not_before", "words"), [
    ("Fri, 31 Dec 9999 23:00:00 -0500", "must be a time in the years 2000-2999"),
    ("Fri, 31 Dec 1999 23:00:00 -0500", "must be a time in the years 2000-2999"),  # 2000 in UTC: as written
    ("Fri, 20 Nov 2026 14:04:32 +99999999999999999999", "an RFC 1123 date"),  # overflowed while parsed
    ("Fri, 20 Nov 2026 14:04:32 +2500", "an RFC 1123 date"),
    ("soon", "an RFC 1123 date"),
])
def test_an_azure_not_before_out_of_range_is_a_400(client, creds, not_before, words):
    body = {"DocumentIncarnation": 1, "Events": [{"EventId": "A1B2", "EventType": "Preempt",
                                                  "Resources": ["vm-1"], "NotBefore": not_before}]}
    _refused(_signed(client, AZURE, creds["azure"], body), "Events[0].NotBefore", words)


def test_notice_times_are_stored_in_utc(client, creds):
    """Each format's times come out of formats in UTC, whatever zone the sender wrote."""
    body = {"instance_id": "i-1", "action": "terminate", "time": "2026-11-20T19:32:00+05:30",
            "deadline": "2026-11-20T09:04:00-05:00"}
    [draft] = formats.generic_drafts(body, team_id=1, msg_id="m1")
    assert (draft.event_time.isoformat(), draft.deadline.isoformat()) == (
        "2026-11-20T14:02:00+00:00", "2026-11-20T14:04:00+00:00")
    assert draft.event_time.tzinfo is UTC and draft.deadline.tzinfo is UTC
    azure = {"Events": [{"EventId": "A1", "EventType": "Preempt", "Resources": ["vm-1"],
                         "NotBefore": "Fri, 20 Nov 2026 09:04:32 -0500"}]}
    [draft] = formats.azure_drafts(azure, team_id=1)
    assert draft.deadline.isoformat() == "2026-11-20T14:04:32+00:00" and draft.deadline.tzinfo is UTC
    response = _signed(client, NOTICE, creds["secret"], body)
    assert response.status_code == 202, response.content
    notice = InterruptionNotice.objects.get()
    assert notice.deadline.isoformat() == "2026-11-20T14:04:00+00:00"
