"""Inbound webhook credentials, SNS subscriptions, and outbound alert endpoints and deliveries."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone


class WebhookSource(models.TextChoices):
    AWS_EVENTBRIDGE = "aws_eventbridge", "AWS EventBridge API destination"
    AWS_SNS = "aws_sns", "AWS SNS HTTPS subscription"
    GCP = "gcp", "GCP Pub/Sub push"
    AZURE = "azure", "Azure scheduled events (forwarded)"
    GENERIC = "generic", "Generic signed notice"


class CredentialScheme(models.TextChoices):
    API_KEY = "api_key", "API key in a header (EventBridge connection)"
    BASIC = "basic", "HTTP basic auth (EventBridge connection)"
    TOKEN = "token", "Shared token (Pub/Sub push `?token=` or X-Spotpipe-Token header)"
    OIDC = "oidc", "OIDC bearer token of a Pub/Sub push subscription"
    STANDARD_WEBHOOKS = "standard_webhooks", "Standard Webhooks HMAC-SHA256 signature"
    SNS_TOPIC = "sns_topic", "Allowed SNS topic (messages are verified by their SNS signature)"


class WebhookCredential(models.Model):
    """One way a team's inbound webhook may authenticate. A team may hold several per source (all
    accepted), which is how secrets rotate: create the new one, let the old one expire.

    Secrets that only need comparing (API keys, basic-auth passwords, shared tokens) are stored as
    a SHA-256 hash. A Standard Webhooks secret is kept as given: the HMAC needs the key itself."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="webhook_credentials")
    source = models.CharField(max_length=20, choices=WebhookSource.choices)
    scheme = models.CharField(max_length=20, choices=CredentialScheme.choices)
    name = models.CharField(max_length=100, blank=True)
    header_name = models.CharField(
        max_length=100, blank=True, help_text="API-key scheme: the header the connection sends (lower case)."
    )
    username = models.CharField(max_length=150, blank=True, help_text="Basic-auth scheme: the user name.")
    secret_hash = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the key, password or token.")
    signing_secret = models.CharField(
        max_length=200, blank=True, help_text="Standard Webhooks scheme: the `whsec_...` secret."
    )
    topic_arn = models.CharField(max_length=300, blank=True, help_text="SNS scheme: the allowed topic ARN.")
    config = models.JSONField(
        default=dict, blank=True,
        help_text="OIDC scheme: {audience, email, public_keys: {kid: PEM}}.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Rotated out: accepted until then.")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["team", "source"], name="webhookcred_team_source_idx")]

    def __str__(self) -> str:
        return f"{self.team_id} {self.source} {self.scheme} {self.name}"


class SnsSubscriptionStatus(models.TextChoices):
    CONFIRMED = "confirmed", "Confirmed"
    UNSUBSCRIBED = "unsubscribed", "Unsubscribed"


class SnsSubscription(models.Model):
    """What the control plane knows of an SNS subscription to one of a team's allowed topics."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="sns_subscriptions")
    topic_arn = models.CharField(max_length=300)
    status = models.CharField(max_length=20, choices=SnsSubscriptionStatus.choices)
    subscribe_url = models.URLField(max_length=1000, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    unsubscribed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "topic_arn"], name="snssubscription_team_topic_unique")
        ]

    def __str__(self) -> str:
        return f"{self.topic_arn} ({self.status})"


class AlertFormat(models.TextChoices):
    SLACK = "slack", "Slack-compatible JSON ({text})"
    GENERIC = "generic", "Generic JSON ({type, timestamp, data})"


class AlertEvent(models.TextChoices):
    JOB_RECOVERING = "job.recovering", "Job recovering"
    JOB_RECOVERED = "job.recovered", "Job recovered"
    JOB_FAILED = "job.failed", "Job failed"
    JOB_FINISHED = "job.finished", "Job finished"
    BUDGET_THRESHOLD = "budget.threshold", "Budget threshold crossed"
    JOB_DEADLINE_UNREACHABLE = "job.deadline_unreachable", "Job deadline unreachable"
    JOB_STOPPED = "job.stopped", "Job stopped at a limit"
    NODE_STANDBY_RELEASED = "node.standby_released", "Node released after standing by too long"


class AlertEndpoint(models.Model):
    """A URL a team registered for outbound alerts. Every delivery is signed with `signing_secret`
    (Standard Webhooks), so the receiver can check it came from us."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="alert_endpoints")
    url = models.URLField(max_length=1000)
    format = models.CharField(max_length=10, choices=AlertFormat.choices, default=AlertFormat.GENERIC)
    events = models.JSONField(default=list, blank=True, help_text="Event types to send; empty means all.")
    signing_secret = models.CharField(max_length=200)
    # While a secret rotates, deliveries carry a second signature with the previous secret until
    # `previous_secret_expires_at`, so a receiver can switch without refusing an alert.
    previous_signing_secret = models.CharField(max_length=200, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.team_id} -> {self.url}"

    def signing_secrets(self, now: datetime | None = None) -> list[str]:
        """The secrets deliveries are signed with now: the current one, and the previous one during
        its grace period."""
        now = now or timezone.now()
        secrets_ = [self.signing_secret]
        if self.previous_signing_secret and self.previous_secret_expires_at and self.previous_secret_expires_at > now:
            secrets_.append(self.previous_signing_secret)
        return secrets_


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class AlertDelivery(models.Model):
    """One alert to one endpoint, with its retry state. `message_id` is the Standard Webhooks
    `webhook-id`: the same on every retry so the receiver can de-duplicate."""

    endpoint = models.ForeignKey(AlertEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40, choices=AlertEvent.choices)
    message_id = models.CharField(max_length=64, unique=True)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="alertdelivery_status_next_idx")]

    def __str__(self) -> str:
        return f"{self.event} -> {self.endpoint_id} ({self.status})"
