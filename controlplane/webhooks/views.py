"""Inbound webhook endpoints. Each does only: size and content-type checks, authentication,
parsing, one idempotent insert, answer. Reacting happens in workers (orchestration.notices).

Plain Django views rather than DRF: this path is measured per request and DRF's machinery (content
negotiation, authentication classes) costs more than the insert. Errors use the API's shape,
`{"detail": "...", "errors": {field: [message]}}`."""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import logging
from collections.abc import Callable

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from controlplane.fleet.models import NoticeSource
from controlplane.fleet.notices import NoticeDraft, notices_store
from controlplane.webhooks import formats, oidc, signing, sns
from controlplane.webhooks.credentials import TeamCredentials, credentials_for, hash_secret
from controlplane.webhooks.models import (
    CredentialScheme,
    SnsSubscription,
    SnsSubscriptionStatus,
    WebhookCredential,
    WebhookSource,
)

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
JSON_TYPES = frozenset({"application/json"})
SNS_TYPES = frozenset({"text/plain", "application/json"})  # SNS posts JSON as text/plain


class WebhookError(Exception):
    """An answer other than success: status, message, and the field at fault."""

    def __init__(self, status: int, message: str, *, field: str = "body") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def _error(status: int, message: str, field: str) -> JsonResponse:
    return JsonResponse({"detail": message, "errors": {field: [message]}}, status=status)


def webhook_view(source: str) -> Callable:
    """POST-only, CSRF-exempt view that turns WebhookError/BadNotice/SnsError into 4xx answers and
    logs every rejection (never the secrets)."""

    def decorate(func: Callable) -> Callable:
        @csrf_exempt
        @functools.wraps(func)
        def view(request: HttpRequest, team_slug: str) -> JsonResponse:
            try:
                if request.method != "POST":
                    raise WebhookError(405, f"method {request.method} not allowed; use POST", field="method")
                return func(request, team_slug)
            except WebhookError as exc:
                status, message, field = exc.status, exc.message, exc.field
            except formats.BadNotice as exc:
                status, message, field = 400, exc.message, exc.field
            except sns.SnsError as exc:
                status, message, field = 401, exc.message, exc.field
            logger.warning("webhook %s rejected for team %r: %s %s (%s)", source, team_slug, status, message, field)
            response = _error(status, message, field)
            if status == 405:
                response["Allow"] = "POST"
            return response

        return view

    return decorate


def _read_body(request: HttpRequest, *, content_types: frozenset[str]) -> bytes:
    length = request.META.get("CONTENT_LENGTH") or ""
    if length:
        try:
            declared = int(length)
        except ValueError:
            raise WebhookError(400, f"bad Content-Length {length[:20]!r}", field="Content-Length") from None
        if declared > MAX_BODY_BYTES:
            raise WebhookError(413, f"body of {declared} bytes is over the {MAX_BODY_BYTES}-byte limit")
    body = request.read(MAX_BODY_BYTES + 1)  # also bounds a chunked body with no Content-Length
    if len(body) > MAX_BODY_BYTES:
        raise WebhookError(413, f"body is over the {MAX_BODY_BYTES}-byte limit")
    if not body:
        raise WebhookError(400, "empty body; expected a JSON object")
    ctype = (request.META.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
    if ctype not in content_types:
        raise WebhookError(
            415, f"content type {ctype or 'none'!r} not accepted; send {' or '.join(sorted(content_types))}",
            field="Content-Type",
        )
    return body


def _team(team_slug: str, source: str) -> TeamCredentials:
    creds = credentials_for(team_slug=team_slug, source=source)
    if creds is None or not creds.credentials:
        # The same answer for an unknown team and for a team without credentials: no probing.
        raise WebhookError(401, f"no {source} webhook credentials are configured for this team", field="team")
    return creds


def _active(cred: WebhookCredential) -> bool:
    return cred.revoked_at is None and (cred.expires_at is None or cred.expires_at > timezone.now())


def _check_secret(cred: WebhookCredential, offered: str) -> bool:
    return hmac.compare_digest(cred.secret_hash, hash_secret(offered))


def _auth_eventbridge(request: HttpRequest, team: TeamCredentials) -> None:
    """API-key header or basic auth, as the team's EventBridge connection is configured."""
    offered_any = False
    for cred in team.of(CredentialScheme.API_KEY):
        value = request.headers.get(cred.header_name)
        if value is not None:
            offered_any = True
            if _active(cred) and _check_secret(cred, value):
                return
    authz = request.headers.get("Authorization", "")
    basic = team.of(CredentialScheme.BASIC)
    if authz[:6].lower() == "basic " and basic:
        offered_any = True
        try:
            user, _, password = base64.b64decode(authz[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, ValueError):
            raise WebhookError(401, "malformed basic Authorization header", field="Authorization") from None
        for cred in basic:
            # As bytes: compare_digest refuses a str with non-ASCII characters (a TypeError, a 500).
            same_user = hmac.compare_digest(cred.username.encode(), user.encode())
            if _active(cred) and same_user and _check_secret(cred, password):
                return
    if not offered_any:
        names = sorted({c.header_name for c in team.of(CredentialScheme.API_KEY)})
        how = " or ".join([f"header {n!r}" for n in names] + (["basic auth"] if basic else []))
        raise WebhookError(401, f"missing credentials: send {how}", field="Authorization")
    raise WebhookError(401, "invalid credentials", field="Authorization")


def _auth_standard_webhooks(request: HttpRequest, team: TeamCredentials, body: bytes) -> str:
    secrets_ = [c.signing_secret for c in team.of(CredentialScheme.STANDARD_WEBHOOKS) if _active(c)]
    try:
        signing.verify(
            secrets_=secrets_, msg_id=request.headers.get("webhook-id"),
            timestamp=request.headers.get("webhook-timestamp"),
            signature=request.headers.get("webhook-signature"), body=body,
        )
    except signing.SignatureError as exc:
        raise WebhookError(401, str(exc), field="webhook-signature") from None
    return request.headers["webhook-id"]


def _auth_gcp(request: HttpRequest, team: TeamCredentials) -> None:
    """Shared token (`?token=` on the push endpoint URL, or X-Spotpipe-Token) or the push
    subscription's OIDC token."""
    token = request.GET.get("token") or request.headers.get("X-Spotpipe-Token")
    authz = request.headers.get("Authorization", "")
    if token:
        if any(_active(c) and _check_secret(c, token) for c in team.of(CredentialScheme.TOKEN)):
            return
        raise WebhookError(401, "invalid token", field="token")
    if authz[:7].lower() == "bearer ":
        errors = []
        for cred in team.of(CredentialScheme.OIDC):
            if not _active(cred):
                continue
            try:
                oidc.verify(authz[7:].strip(), audience=cred.config.get("audience", ""),
                            public_keys=cred.config.get("public_keys") or None, email=cred.config.get("email", ""))
                return
            except oidc.KeysUnavailable as exc:
                # Not the sender's fault: 503 so Pub/Sub retries the push later.
                raise WebhookError(503, str(exc), field="Authorization") from None
            except oidc.OidcError as exc:
                errors.append(str(exc))
        raise WebhookError(401, f"invalid OIDC token: {'; '.join(errors) or 'no OIDC credential'}",
                           field="Authorization")
    raise WebhookError(401, "missing credentials: add ?token= to the push URL or enable OIDC auth",
                       field="token")


def _store(drafts: list[NoticeDraft]) -> JsonResponse:
    result = notices_store(drafts=drafts)
    if not result.stored:
        return JsonResponse({"status": "duplicate", "stored": 0, "duplicates": len(result.duplicates)}, status=200)
    return JsonResponse(
        {"status": "stored", "stored": len(result.stored), "duplicates": len(result.duplicates),
         "ids": sorted(result.stored.values())},
        status=202,
    )


@webhook_view(WebhookSource.AWS_EVENTBRIDGE)
def aws_eventbridge(request: HttpRequest, team_slug: str) -> JsonResponse:
    """EventBridge API destination: one EC2 event per request."""
    body = _read_body(request, content_types=JSON_TYPES)
    team = _team(team_slug, WebhookSource.AWS_EVENTBRIDGE)
    _auth_eventbridge(request, team)
    event = formats.parse_json(body)
    return _store(formats.eventbridge_drafts(event, team_id=team.team_id, source=NoticeSource.AWS_EVENTBRIDGE))


@webhook_view(WebhookSource.AWS_SNS)
def aws_sns(request: HttpRequest, team_slug: str) -> JsonResponse:
    """SNS HTTPS subscription: confirmations and notifications, each verified by its signature."""
    body = _read_body(request, content_types=SNS_TYPES)
    team = _team(team_slug, WebhookSource.AWS_SNS)
    message = formats.parse_json(body)
    if not isinstance(message, dict):
        raise formats.BadNotice("body must be a JSON object")
    header_type = request.headers.get("x-amz-sns-message-type")
    if header_type and header_type != message.get("Type"):
        raise WebhookError(400, f"x-amz-sns-message-type {header_type!r} does not match Type "
                                f"{message.get('Type')!r}", field="x-amz-sns-message-type")
    if message.get("Type") not in sns.MESSAGE_TYPES:
        raise WebhookError(400, f"unsupported Type {message.get('Type')!r}; expected one of "
                                f"{', '.join(sns.MESSAGE_TYPES)}", field="Type")
    topic = message.get("TopicArn")
    allowed = {c.topic_arn for c in team.of(CredentialScheme.SNS_TOPIC) if _active(c)}
    if topic not in allowed:
        raise WebhookError(403, f"topic {topic!r} is not allowed for this team", field="TopicArn")
    sns.verify(message)
    kind = message["Type"]
    if kind == "SubscriptionConfirmation":
        return _sns_confirm(team, message)
    if kind == "UnsubscribeConfirmation":
        SnsSubscription.objects.update_or_create(
            team_id=team.team_id, topic_arn=topic,
            defaults={"status": SnsSubscriptionStatus.UNSUBSCRIBED, "unsubscribed_at": timezone.now()},
        )
        logger.info("SNS subscription to %s was unsubscribed (team %s)", topic, team.team_slug)
        return JsonResponse({"status": "unsubscribed"}, status=200)
    if not isinstance(message.get("Message"), str):
        raise formats.BadNotice("missing Message", field="Message")
    event = formats.parse_json(message["Message"].encode(), field="Message")
    meta = {"sns_message_id": message["MessageId"], "topic_arn": topic}
    return _store(formats.eventbridge_drafts(event, team_id=team.team_id, source=NoticeSource.AWS_SNS, meta=meta))


def _sns_confirm(team: TeamCredentials, message: dict) -> JsonResponse:
    url = sns.check_aws_url(message.get("SubscribeURL"), field="SubscribeURL")
    try:
        status = sns.confirm_get(url)
    except Exception as exc:  # network errors: SNS retries the confirmation
        logger.warning("SNS confirmation GET failed for %s: %s", message["TopicArn"], exc)
        raise WebhookError(502, f"could not confirm the subscription: {type(exc).__name__}",
                           field="SubscribeURL") from None
    if not 200 <= status < 300:
        raise WebhookError(502, f"SubscribeURL answered {status}", field="SubscribeURL")
    with transaction.atomic():
        SnsSubscription.objects.update_or_create(
            team_id=team.team_id, topic_arn=message["TopicArn"],
            defaults={"status": SnsSubscriptionStatus.CONFIRMED, "subscribe_url": url[:1000],
                      "confirmed_at": timezone.now(), "unsubscribed_at": None},
        )
    logger.info("confirmed SNS subscription to %s for team %s", message["TopicArn"], team.team_slug)
    return JsonResponse({"status": "confirmed"}, status=200)


@webhook_view(WebhookSource.GCP)
def gcp(request: HttpRequest, team_slug: str) -> JsonResponse:
    """Pub/Sub push of the `compute.instances.preempted` audit-log entry."""
    body = _read_body(request, content_types=JSON_TYPES)
    team = _team(team_slug, WebhookSource.GCP)
    _auth_gcp(request, team)
    return _store(formats.gcp_push_drafts(formats.parse_json(body), team_id=team.team_id))


@webhook_view(WebhookSource.AZURE)
def azure(request: HttpRequest, team_slug: str) -> JsonResponse:
    """A forwarded Azure scheduled-events document, signed with Standard Webhooks."""
    body = _read_body(request, content_types=JSON_TYPES)
    team = _team(team_slug, WebhookSource.AZURE)
    _auth_standard_webhooks(request, team, body)
    return _store(formats.azure_drafts(formats.parse_json(body), team_id=team.team_id))


@webhook_view(WebhookSource.GENERIC)
def generic_notice(request: HttpRequest, team_slug: str) -> JsonResponse:
    """A notice from an agent or another tool, signed with Standard Webhooks."""
    body = _read_body(request, content_types=JSON_TYPES)
    team = _team(team_slug, WebhookSource.GENERIC)
    msg_id = _auth_standard_webhooks(request, team, body)
    return _store(formats.generic_drafts(formats.parse_json(body), team_id=team.team_id, msg_id=msg_id))


@csrf_exempt
def bench_parse_only(request: HttpRequest) -> JsonResponse:
    """Benchmark baseline (routed only when SPOTPIPE_BENCH_ENDPOINTS=1): read and parse the body and
    answer, with no auth, no insert, no hand-off. What the same server costs per request at best."""
    body = request.read(MAX_BODY_BYTES + 1)
    formats.parse_json(body)
    return JsonResponse({"status": "parsed"}, status=200)
