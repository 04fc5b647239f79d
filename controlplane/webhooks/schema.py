"""The inbound webhook receivers (`views.py`, plain Django views, which drf-spectacular does not
see) in the OpenAPI schema: a postprocessing hook adds their paths, bodies, credentials and
answers, so clients and the schema fuzz (tests/reliability/test_api_fuzz.py) can trust them too.

What a body must hold is stated as far as OpenAPI 3.0 can: the EventBridge event and the generic
notice in full (formats.py's rules: required strings without control characters, lengths, enums,
times with a zone). Three carry rules no schema can state, and their descriptions say so: Pub/Sub's
`message.data` is base64 of a JSON audit-log entry, an Azure document needs one Preempt/Terminate
event among any others, and an SNS message is valid only with AWS's signature over it."""

from __future__ import annotations

from typing import Any

from controlplane.webhooks import formats
from controlplane.webhooks.views import MAX_BODY_BYTES

PREFIX = "/api/v1/webhooks"
JSON = "application/json"
TEAM_SLUG = {"in": "path", "name": "team_slug", "required": True,
             "schema": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
             "description": "The team's slug: the credentials configured for it authenticate the sender."}


def _text(max_length: int) -> dict[str, Any]:
    """formats._str: a non-empty string, no control characters, no surrounding whitespace counted."""
    edge = r"[^\s\x00-\x1f\x7f-\x9f]"
    return {"type": "string", "maxLength": max_length,
            "pattern": rf"^{edge}([^\x00-\x1f\x7f]*{edge})?$"}


_YEARS = formats.NOTICE_YEARS
assert (_YEARS[0], _YEARS[-1]) == (2000, 2999), "the pattern below states these years"
TIME = {"type": "string", "format": "date-time", "pattern": "^2[0-9]{3}-",
        "description": f"ISO 8601 with a zone, in the years {_YEARS[0]}-{_YEARS[-1]}."}

EVENTBRIDGE_COMMON = {"id": _text(formats.MAX_EVENT_ID), "time": TIME}


def _eventbridge(detail_type: str, detail: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object", "required": ["id", "detail-type", "time", "detail"],
        "properties": {
            **EVENTBRIDGE_COMMON, "detail-type": {"type": "string", "enum": [detail_type]},
            "detail": {"type": "object", "required": ["instance-id", *required],
                       "properties": {"instance-id": _text(formats.MAX_INSTANCE_ID), **detail}},
        },
    }


EVENTBRIDGE_EVENT = {
    "description": "One EC2 event as an EventBridge API destination sends it.",
    "oneOf": [
        _eventbridge(formats.AWS_SPOT_WARNING,
                     {"instance-action": {"type": "string", "enum": sorted(formats.AWS_SPOT_ACTIONS)}},
                     ["instance-action"]),
        _eventbridge(formats.AWS_REBALANCE, {}, []),
        _eventbridge(formats.AWS_STATE_CHANGE, {"state": _text(formats.MAX_ACTION)}, ["state"]),
    ],
}

GENERIC_NOTICE = {
    "type": "object", "required": ["instance_id", "action"],
    "description": "A notice from an agent or a tool. (An agent may instead send `{instance_id, imds}`: "
                   "the raw AWS metadata body it read.)",
    "properties": {
        "instance_id": _text(formats.MAX_INSTANCE_ID),
        "action": {"type": "string", "enum": list(formats.GENERIC_ACTIONS)},
        "time": {**TIME, "nullable": True}, "deadline": {**TIME, "nullable": True},
        "source": {"type": "string", "description": "`agent` marks a notice an agent forwarded."},
    },
}

GCP_PUSH = {
    "type": "object", "required": ["message"],
    "description": "A Pub/Sub push envelope. `message.data` must be base64 of the JSON audit-log entry of "
                   "`compute.instances.preempted` (a rule OpenAPI cannot state).",
    "properties": {"message": {"type": "object", "required": ["data"],
                               "properties": {"data": {"type": "string", "format": "byte"},
                                              "messageId": {"type": "string"}}},
                   "subscription": {"type": "string"}},
}

AZURE_DOCUMENT = {
    "type": "object", "required": ["Events"],
    "description": "An Azure scheduled-events document; at least one event must be a Preempt or Terminate "
                   "(others are skipped), each with a non-empty `Resources` list of VM names.",
    "properties": {"DocumentIncarnation": {"type": "integer"},
                   "Events": {"type": "array", "minItems": 1, "items": {"type": "object"}}},
}

SNS_MESSAGE = {
    "type": "object", "required": ["Type", "TopicArn"],
    "description": "An SNS message as SNS posts it (JSON sent as text/plain), valid only with AWS's signature.",
    "properties": {"Type": {"type": "string"}, "TopicArn": {"type": "string"}},
}

SIGNATURE_HEADERS = [
    {"in": "header", "name": name, "required": True, "schema": {"type": "string"}, "description": text}
    for name, text in (
        ("webhook-id", "Standard Webhooks: the message id (the notice's dedup key)."),
        ("webhook-timestamp", "Standard Webhooks: Unix seconds, within 5 minutes of now."),
        ("webhook-signature", "Standard Webhooks: `v1,<base64 HMAC-SHA256>` with the credential's secret."),
    )
]

STORED = {"type": "object", "required": ["status", "stored", "duplicates"], "properties": {
    "status": {"type": "string", "enum": ["stored", "duplicate", "confirmed", "unsubscribed"]},
    "stored": {"type": "integer"}, "duplicates": {"type": "integer"},
    "ids": {"type": "array", "items": {"type": "integer"}},
}}
ANSWERED = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}

ERRORS = {
    "400": "A malformed or unsupported body, or a bad header (named in `errors`).",
    "401": "Missing or invalid credentials or signature.",
    "404": "No such route (a team slug holding characters a slug cannot have).",
    "405": "A method other than POST (`Allow: POST`).",
    "413": f"A body over {MAX_BODY_BYTES} bytes.",
    "415": "A content type the receiver does not take.",
    "429": "Too many requests from this client address; `Retry-After` says when to try again.",
}

SECURITY_SCHEMES = {
    "webhookApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
                      "description": "EventBridge connection API key (the header name is the credential's)."},
    "webhookBasic": {"type": "http", "scheme": "basic", "description": "EventBridge connection basic auth."},
    "webhookToken": {"type": "apiKey", "in": "header", "name": "X-Spotpipe-Token",
                     "description": "Pub/Sub push: the shared token (or `?token=` on the push URL)."},
    "webhookOidc": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                    "description": "Pub/Sub push: the subscription's OIDC token."},
}


def _operation(name: str, summary: str, body: dict[str, Any], *, media_types: tuple[str, ...] = (JSON,),
               security: list[dict] | None = None, headers: list[dict] | None = None,
               extra: dict[str, str] | None = None, ok: dict[str, Any] = STORED) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/ApiError"}
    responses: dict[str, Any] = {
        "200": {"description": "Already stored (a retry), or an SNS (un)subscription handled.",
                "content": {JSON: {"schema": ok if ok is not STORED else STORED}}},
        "202": {"description": "Stored; reacting happens in the workers.", "content": {JSON: {"schema": STORED}}},
    }
    for code, text in {**ERRORS, **(extra or {})}.items():
        responses[code] = {"description": text, "content": {JSON: {"schema": error}}}
    operation = {
        "operationId": f"webhooks_{name}", "summary": summary, "tags": ["webhooks"],
        "parameters": [TEAM_SLUG, *(headers or [])],
        "requestBody": {"required": True, "content": {m: {"schema": body} for m in media_types}},
        "responses": dict(sorted(responses.items())),
        "security": security if security is not None else [],
    }
    return {"post": operation}


def add_intake_paths(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"])."""
    paths = result.setdefault("paths", {})
    paths[f"{PREFIX}/aws/eventbridge/{{team_slug}}/"] = _operation(
        "aws_eventbridge", "EventBridge API destination: one EC2 event.", EVENTBRIDGE_EVENT,
        security=[{"webhookApiKey": []}, {"webhookBasic": []}])
    paths[f"{PREFIX}/aws/sns/{{team_slug}}/"] = _operation(
        "aws_sns", "SNS HTTPS subscription: confirmations and notifications.", SNS_MESSAGE,
        media_types=("text/plain", JSON),
        extra={"403": "The topic is not allowed for this team.",
               "502": "The subscription could not be confirmed (SNS retries)."})
    paths[f"{PREFIX}/gcp/{{team_slug}}/"] = _operation(
        "gcp", "Pub/Sub push of `compute.instances.preempted`.", GCP_PUSH,
        security=[{"webhookToken": []}, {"webhookOidc": []}],
        extra={"503": "Google's OIDC keys could not be fetched (Pub/Sub retries)."})
    paths[f"{PREFIX}/azure/{{team_slug}}/"] = _operation(
        "azure", "A forwarded Azure scheduled-events document.", AZURE_DOCUMENT, headers=SIGNATURE_HEADERS)
    paths[f"{PREFIX}/notice/{{team_slug}}/"] = _operation(
        "notice", "A notice from an agent or another tool.", GENERIC_NOTICE, headers=SIGNATURE_HEADERS)
    result.setdefault("components", {}).setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
    result["paths"] = dict(sorted(paths.items()))
    return result
