"""Cloud notice formats -> `NoticeDraft`s. Pure functions: no database, no auth. Each raises
`BadNotice` naming the missing or wrong field."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from controlplane.fleet.models import NoticeKind, NoticeSource
from controlplane.fleet.notices import NoticeDraft
from runtime.storable import unstorable_path

AWS_SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
AWS_REBALANCE = "EC2 Instance Rebalance Recommendation"
AWS_STATE_CHANGE = "EC2 Instance State-change Notification"
AWS_DETAIL_TYPES = (AWS_SPOT_WARNING, AWS_REBALANCE, AWS_STATE_CHANGE)
AWS_SPOT_ACTIONS = frozenset({"terminate", "stop", "hibernate"})
AWS_NOTICE_LEAD = timedelta(minutes=2)
AZURE_EVENT_TYPES = frozenset({"Preempt", "Terminate"})
GENERIC_ACTIONS = {
    "terminate": NoticeKind.INTERRUPTION, "stop": NoticeKind.INTERRUPTION,
    "hibernate": NoticeKind.INTERRUPTION, "preempt": NoticeKind.INTERRUPTION,
    "rebalance": NoticeKind.REBALANCE, "preempted": NoticeKind.PREEMPTED,
}


# Bounds of what is stored (fleet.InterruptionNotice's columns): a longer value, a NUL or another
# control character would be a 500 on PostgreSQL (and a 202 on SQLite) instead of a 400, and
# EventBridge retries a 5xx for 24 hours.
MAX_INSTANCE_ID = 100
MAX_ACTION = 20
# The dedup key is "<team id>:<cloud>:<event id>[:<resource>]" in 200 characters.
MAX_EVENT_ID = 120
MAX_AZURE_EVENT_ID = 60

# Every notice time of every format (`time`, `deadline`, `NotBefore`, ...) is written in one of these
# years (as the sender wrote it, in its own zone: what the schema states, `webhooks/schema.py`) and
# stored in UTC: anything else is a sender's bug, and near years 1 and 9999 the lead-time arithmetic
# and the stores' conversions overflow (a 500 on SQLite, on PostgreSQL a row every later read fails on).
NOTICE_YEARS = range(2000, 3000)


class BadNotice(Exception):
    """Input that is not a notice we accept; `field` names the offending part."""

    def __init__(self, message: str, *, field: str = "body") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def parse_json(body: bytes, *, field: str = "body") -> Any:
    """JSON from bytes, or BadNotice saying where it broke. A small body nested thousands deep
    exhausts the parser's recursion (a 400, not a 500), and what no store accepts anywhere is
    refused (`runtime.storable`): the notice's JSON payload is stored."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadNotice(f"malformed JSON: {exc}", field=field) from None
    except RecursionError:
        raise BadNotice("JSON nested too deeply", field=field) from None
    _refuse_unstorable(value, field)
    return value


def _refuse_unstorable(value: Any, field: str) -> None:
    """Raise BadNotice naming the first key or string no store accepts (`runtime.storable`)."""
    found = unstorable_path(value, field)
    if found is not None:
        where, what = found
        raise BadNotice(f"{where} contains {what}", field=where.removeprefix("a key of "))


def _obj(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise BadNotice(f"{field} must be a JSON object", field=field)
    return value


def _str(obj: dict, key: str, field: str | None = None, *, max_length: int = MAX_EVENT_ID) -> str:
    """A non-empty string of at most `max_length` characters, without control characters."""
    field = field or key
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadNotice(f"missing or empty string field {field!r}", field=field)
    value = value.strip()
    if len(value) > max_length:
        raise BadNotice(f"{field} is longer than {max_length} characters", field=field)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise BadNotice(f"{field} contains control characters", field=field)
    return value


def _time(value: Any, field: str, *, rfc1123: bool = False) -> datetime:
    """A notice time, the one rule of every format: an ISO 8601 time with a zone (`rfc1123`: an RFC
    1123 date, as Azure sends) written in one of NOTICE_YEARS, in UTC."""
    expected = "an RFC 1123 date" if rfc1123 else "an ISO 8601 time with a zone"
    try:
        if not isinstance(value, str):
            parsed = None
        elif rfc1123:
            parsed = parsedate_to_datetime(value)
            # RFC 5322: "-0000" (and no zone, which the parser reads alike) is a time in UTC.
            parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        else:
            parsed = parse_datetime(value)
    except (ValueError, OverflowError):  # well formed but no such time (month 13, second 60, zone +25:00)
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise BadNotice(f"{field} must be {expected}, got {value!r}", field=field)
    if parsed.year not in NOTICE_YEARS:
        raise BadNotice(f"{field} must be a time in the years {NOTICE_YEARS[0]}-{NOTICE_YEARS[-1]}, got {value!r}",
                        field=field)
    return parsed.astimezone(UTC)  # a day either way of those years: no overflow


def eventbridge_drafts(event: Any, *, team_id: int, source: str, meta: dict | None = None) -> list[NoticeDraft]:
    """One EventBridge EC2 event (spot interruption warning, rebalance recommendation or instance
    state change) -> one draft, keyed by the event id (so the same event via SNS is the same)."""
    event = _obj(event, "body")
    detail_type = _str(event, "detail-type")
    if detail_type not in AWS_DETAIL_TYPES:
        raise BadNotice(
            f"unsupported detail-type {detail_type!r}; expected one of {', '.join(AWS_DETAIL_TYPES)}",
            field="detail-type",
        )
    event_id = _str(event, "id")
    event_time = _time(event.get("time"), "time")
    detail = _obj(event.get("detail"), "detail")
    instance_id = _str(detail, "instance-id", "detail.instance-id", max_length=MAX_INSTANCE_ID)
    deadline = None
    if detail_type == AWS_SPOT_WARNING:
        kind = NoticeKind.INTERRUPTION
        action = _str(detail, "instance-action", "detail.instance-action")
        if action not in AWS_SPOT_ACTIONS:
            raise BadNotice(f"detail.instance-action must be one of terminate, stop, hibernate; got {action!r}",
                            field="detail.instance-action")
        deadline = event_time + AWS_NOTICE_LEAD  # cannot overflow: _time bounds event_time
    elif detail_type == AWS_REBALANCE:
        kind, action = NoticeKind.REBALANCE, ""
    else:
        kind, action = NoticeKind.STATE_CHANGE, _str(detail, "state", "detail.state", max_length=MAX_ACTION)
        deadline = event_time
    return [NoticeDraft(
        team_id=team_id, source=source, kind=kind, action=action,
        dedup_key=f"{team_id}:aws:{event_id}", cloud_event_id=event_id, provider_instance_id=instance_id,
        event_time=event_time, deadline=deadline, payload={"event": event, "meta": meta or {}},
    )]


def gcp_push_drafts(body: Any, *, team_id: int) -> list[NoticeDraft]:
    """A Pub/Sub push envelope whose `message.data` is a base64 audit-log entry for
    `compute.instances.preempted` -> one draft, keyed by the log entry's insertId."""
    body = _obj(body, "body")
    message = _obj(body.get("message"), "message")
    data = _str(message, "data", "message.data", max_length=2**21)  # the request body bounds it
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadNotice("message.data must be base64", field="message.data") from None
    entry = _obj(parse_json(raw, field="message.data"), "message.data")
    payload = _obj(entry.get("protoPayload"), "protoPayload")
    method = payload.get("methodName")
    if method != "compute.instances.preempted":
        raise BadNotice(f"unsupported protoPayload.methodName {method!r}; expected 'compute.instances.preempted'",
                        field="protoPayload.methodName")
    labels = _obj(_obj(entry.get("resource"), "resource").get("labels"), "resource.labels")
    instance_id = _str(labels, "instance_id", "resource.labels.instance_id", max_length=MAX_INSTANCE_ID)
    insert_id = _str(entry, "insertId")
    event_time = _time(entry.get("timestamp"), "timestamp")
    name = str(payload.get("resourceName", "")).rsplit("/", 1)[-1]
    meta = {"instance_name": name, "message_id": message.get("messageId", ""),
            "subscription": body.get("subscription", ""), "zone": labels.get("zone", "")}
    return [NoticeDraft(
        team_id=team_id, source=NoticeSource.GCP, kind=NoticeKind.PREEMPTED, action="preempted",
        dedup_key=f"{team_id}:gcp:{insert_id}", cloud_event_id=insert_id, provider_instance_id=instance_id,
        event_time=event_time, deadline=event_time, payload={"event": entry, "meta": meta},
    )]


def azure_drafts(body: Any, *, team_id: int) -> list[NoticeDraft]:
    """An Azure scheduled-events document (as an agent or tool forwards it) -> one draft per
    resource of each Preempt/Terminate event, keyed by EventId + resource."""
    body = _obj(body, "body")
    events = body.get("Events")
    if not isinstance(events, list) or not events:
        raise BadNotice("Events must be a non-empty list", field="Events")
    drafts = []
    for i, event in enumerate(events):
        event = _obj(event, f"Events[{i}]")
        event_type = _str(event, "EventType", f"Events[{i}].EventType")
        if event_type not in AZURE_EVENT_TYPES:
            continue  # Freeze, Reboot, Redeploy: not an interruption
        event_id = _str(event, "EventId", f"Events[{i}].EventId", max_length=MAX_AZURE_EVENT_ID)
        resources = event.get("Resources")
        if not isinstance(resources, list) or not resources or not all(isinstance(r, str) for r in resources):
            raise BadNotice(f"Events[{i}].Resources must be a non-empty list of VM names",
                            field=f"Events[{i}].Resources")
        resources = [_str({"name": r}, "name", f"Events[{i}].Resources[{n}]", max_length=MAX_AZURE_EVENT_ID)
                     for n, r in enumerate(resources)]
        deadline = None
        if event.get("NotBefore"):  # "" while no time is set
            deadline = _time(event["NotBefore"], f"Events[{i}].NotBefore", rfc1123=True)
        for resource in resources:
            drafts.append(NoticeDraft(
                team_id=team_id, source=NoticeSource.AZURE, kind=NoticeKind.INTERRUPTION,
                action=event_type.lower(), dedup_key=f"{team_id}:azure:{event_id}:{resource}",
                cloud_event_id=event_id, provider_instance_id=resource, deadline=deadline,
                payload={"event": event, "meta": {"DocumentIncarnation": body.get("DocumentIncarnation")}},
            ))
    if not drafts:
        raise BadNotice(f"no Preempt or Terminate event among {len(events)} events", field="Events")
    return drafts


def _imds(imds: Any) -> tuple[str, datetime | None, datetime | None]:
    """An AWS instance-metadata body as the agent read it: `spot/instance-action`
    ({action, time}: time is when the VM goes) or `events/recommendations/rebalance` ({noticeTime})."""
    imds = _obj(imds, "imds")
    if "action" in imds:
        action = _str(imds, "action", "imds.action")
        if action not in AWS_SPOT_ACTIONS:
            raise BadNotice(f"imds.action must be one of terminate, stop, hibernate; got {action!r}",
                            field="imds.action")
        deadline = _time(imds.get("time"), "imds.time")
        return action, deadline - AWS_NOTICE_LEAD, deadline  # cannot overflow: _time bounds deadline
    if "noticeTime" in imds:
        return "rebalance", _time(imds.get("noticeTime"), "imds.noticeTime"), None
    raise BadNotice("imds must be a spot/instance-action body {action, time} or a rebalance body {noticeTime}",
                    field="imds")


def generic_drafts(body: Any, *, team_id: int, msg_id: str) -> list[NoticeDraft]:
    """A generic notice {instance_id, action, time?, deadline?, source?} keyed by its
    Standard Webhooks `webhook-id`. An agent may instead forward the raw AWS metadata body it read,
    as {instance_id, imds: {...}, source: "agent"}."""
    body = _obj(body, "body")
    instance_id = _str(body, "instance_id", max_length=MAX_INSTANCE_ID)
    if len(msg_id) > MAX_EVENT_ID:
        raise BadNotice(f"webhook-id is longer than {MAX_EVENT_ID} characters", field="webhook-id")
    if body.get("imds") is not None and body.get("action") is None:
        action, event_time, deadline = _imds(body["imds"])
    else:
        action = _str(body, "action")
        if action not in GENERIC_ACTIONS:
            raise BadNotice(f"action must be one of {', '.join(GENERIC_ACTIONS)}; got {action!r}", field="action")
        event_time = _time(body["time"], "time") if body.get("time") is not None else None
        deadline = _time(body["deadline"], "deadline") if body.get("deadline") is not None else None
    source = NoticeSource.AGENT if body.get("source") == "agent" else NoticeSource.GENERIC
    return [NoticeDraft(
        team_id=team_id, source=source, kind=GENERIC_ACTIONS[action], action=action,
        dedup_key=f"{team_id}:generic:{msg_id}", cloud_event_id=msg_id, provider_instance_id=instance_id,
        event_time=event_time, deadline=deadline, payload={"event": body, "meta": {}},
    )]
