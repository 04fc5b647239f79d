"""Serializers of the webhook management API: a team's outbound alert endpoints and its inbound
webhook credentials. Secrets appear only in the answers of create and rotate (`*CreatedSerializer`)."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.utils import timezone
from rest_framework import serializers

from controlplane.common.api import NamedChoiceField
from controlplane.common.fields import CharField, EmailField, ModelSerializer
from controlplane.common.limits import MAX_ID
from controlplane.webhooks.alerts import ROTATION_GRACE_DEFAULT, ROTATION_GRACE_MAX, URL_MAX_LENGTH
from controlplane.webhooks.models import (
    AlertEndpoint,
    AlertEvent,
    AlertFormat,
    CredentialScheme,
    WebhookCredential,
    WebhookSource,
)

# A secret the client chooses (to match an existing EventBridge connection, say) must not be guessable.
MIN_CLIENT_SECRET_LENGTH = 16


# The shape of an alert URL, stated in the schema (a `pattern`): http(s), a host without user:password@,
# an optional port, no whitespace and no #fragment. The service checks the same and more (the host
# must be public: webhooks/alerts.py `alert_url_check`).
ALERT_URL_SHAPE = RegexValidator(
    r"^[hH][tT][tT][pP][sS]?://([^\s/?#@:\[\]]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?([/?][^\s#]*)?$",
    message="url must be http:// or https://, a host and an optional port, without credentials (user:password@), "
            "whitespace or a #fragment",
)


def _alert_events_field(**kwargs: object) -> serializers.ListField:
    return serializers.ListField(
        child=NamedChoiceField(choices=AlertEvent.choices, enum_name="AlertEventEnum"), max_length=len(AlertEvent),
        help_text="Events to send; empty means all.", **kwargs,
    )


class AlertEndpointSerializer(ModelSerializer):
    format = NamedChoiceField(choices=AlertFormat.choices, enum_name="AlertFormatEnum", read_only=True)
    events = _alert_events_field(read_only=True)
    previous_secret_valid_until = serializers.DateTimeField(
        source="previous_secret_expires_at", read_only=True, allow_null=True,
        help_text="After a rotation, deliveries are also signed with the previous secret until then.",
    )

    class Meta:
        model = AlertEndpoint
        fields = ["id", "team", "url", "format", "events", "active", "created_at", "secret_rotated_at",
                  "previous_secret_valid_until"]
        read_only_fields = fields


class AlertEndpointCreatedSerializer(AlertEndpointSerializer):
    signing_secret = CharField(
        read_only=True, help_text="The Standard Webhooks `whsec_...` secret deliveries are signed with. Shown once."
    )

    class Meta(AlertEndpointSerializer.Meta):
        fields = [*AlertEndpointSerializer.Meta.fields, "signing_secret"]
        read_only_fields = fields


class AlertEndpointCreateSerializer(serializers.Serializer):
    """Input of `POST /alert-endpoints/`. `team` may be left out when the requester has one team.
    The URL is checked by the service (http(s), a host, no credentials)."""

    team = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    url = CharField(max_length=URL_MAX_LENGTH, trim_whitespace=False, validators=[ALERT_URL_SHAPE])
    format = NamedChoiceField(choices=AlertFormat.choices, enum_name="AlertFormatEnum", default=AlertFormat.GENERIC)
    events = _alert_events_field(required=False, default=list)


class AlertEndpointUpdateSerializer(serializers.Serializer):
    """Input of `PATCH /alert-endpoints/{id}/`: only the fields given change."""

    url = CharField(max_length=URL_MAX_LENGTH, required=False, trim_whitespace=False,
                                validators=[ALERT_URL_SHAPE])
    format = NamedChoiceField(choices=AlertFormat.choices, enum_name="AlertFormatEnum", required=False)
    events = _alert_events_field(required=False)
    active = serializers.BooleanField(required=False)


class SecretRotateSerializer(serializers.Serializer):
    grace_hours = serializers.FloatField(
        required=False, default=ROTATION_GRACE_DEFAULT.total_seconds() / 3600, min_value=0,
        max_value=ROTATION_GRACE_MAX.total_seconds() / 3600,
        help_text="How long the previous secret stays valid (hours; 0 ends it at once).",
    )


class WebhookCredentialSerializer(ModelSerializer):
    """A credential without its secret (nor its hash)."""

    source = NamedChoiceField(choices=WebhookSource.choices, enum_name="WebhookSourceEnum", read_only=True)
    scheme = NamedChoiceField(choices=CredentialScheme.choices, enum_name="CredentialSchemeEnum", read_only=True)
    active = serializers.SerializerMethodField()

    class Meta:
        model = WebhookCredential
        fields = ["id", "team", "source", "scheme", "name", "header_name", "username", "topic_arn", "created_at",
                  "expires_at", "revoked_at", "active"]
        read_only_fields = fields

    def get_active(self, obj: WebhookCredential) -> bool:
        return obj.revoked_at is None and (obj.expires_at is None or obj.expires_at > timezone.now())


class WebhookCredentialCreatedSerializer(WebhookCredentialSerializer):
    secret = CharField(
        read_only=True,
        help_text="The API key, password, token or `whsec_...` signing secret, shown once (empty for sns_topic "
                  "and oidc). Only a hash is kept for keys, passwords and tokens.",
    )

    class Meta(WebhookCredentialSerializer.Meta):
        fields = [*WebhookCredentialSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class OidcConfigSerializer(serializers.Serializer):
    audience = CharField(max_length=500)
    email = EmailField(
        max_length=254, help_text="The push subscription's service account: tokens of any other account are refused.")
    public_keys = serializers.DictField(
        child=CharField(max_length=10_000), allow_empty=False, required=False,
        help_text="Optional pinned signing keys {kid: PEM}, the only ones then accepted. Leave out to use "
                  "Google's published keys, fetched and cached (they rotate).",
    )


class WebhookCredentialCreateSerializer(serializers.Serializer):
    """Input of `POST /webhook-credentials/`. Which scheme applies to which source:
    aws_eventbridge: api_key or basic; aws_sns: sns_topic; gcp: token or oidc; azure and generic:
    standard_webhooks."""

    team = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    source = NamedChoiceField(choices=WebhookSource.choices, enum_name="WebhookSourceEnum")
    scheme = NamedChoiceField(choices=CredentialScheme.choices, enum_name="CredentialSchemeEnum")
    name = CharField(max_length=100, required=False, allow_blank=True, default="")
    header_name = CharField(max_length=100, required=False, default="x-api-key",
                                        help_text="api_key: the header the EventBridge connection sends.")
    username = CharField(max_length=150, required=False, allow_blank=True, default="",
                                     help_text="basic: the user name.")
    secret = CharField(
        min_length=MIN_CLIENT_SECRET_LENGTH, max_length=200, required=False, write_only=True, trim_whitespace=False,
        help_text=f"Optional: use this secret instead of a generated one (at least {MIN_CLIENT_SECRET_LENGTH} "
                  "characters; standard_webhooks: `whsec_` + base64).",
    )
    topic_arn = CharField(max_length=300, required=False, allow_blank=True, default="",
                                      help_text="sns_topic: the allowed topic ARN.")
    oidc = OidcConfigSerializer(required=False, help_text="oidc: the push subscription's token settings.")

    def validate_secret(self, value: str) -> str:
        # The message never repeats the value: 400 answers are logged.
        if len(value) < MIN_CLIENT_SECRET_LENGTH:
            raise serializers.ValidationError(f"must be at least {MIN_CLIENT_SECRET_LENGTH} characters")
        if any(ch.isspace() or ord(ch) < 32 for ch in value):
            raise serializers.ValidationError("must not contain whitespace or control characters")
        return value

    def validate(self, attrs: dict) -> dict:
        scheme = attrs["scheme"]
        if scheme == CredentialScheme.OIDC and "oidc" not in attrs:
            raise serializers.ValidationError({"oidc": ["required for the oidc scheme"]})
        if scheme != CredentialScheme.OIDC and "oidc" in attrs:
            raise serializers.ValidationError({"oidc": ["only for the oidc scheme"]})
        if scheme == CredentialScheme.SNS_TOPIC and not attrs.get("topic_arn"):
            raise serializers.ValidationError({"topic_arn": ["required for the sns_topic scheme"]})
        if scheme == CredentialScheme.BASIC and not attrs.get("username"):
            raise serializers.ValidationError({"username": ["required for the basic scheme"]})
        if "secret" in attrs and scheme in (CredentialScheme.SNS_TOPIC, CredentialScheme.OIDC):
            raise serializers.ValidationError({"secret": [f"the {scheme} scheme has no secret"]})
        return attrs


