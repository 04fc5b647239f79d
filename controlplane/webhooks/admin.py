"""Admin views of webhook credentials, SNS subscriptions and alert deliveries (secrets hidden)."""

from django.contrib import admin

from controlplane.webhooks.models import AlertDelivery, AlertEndpoint, SnsSubscription, WebhookCredential


@admin.register(WebhookCredential)
class WebhookCredentialAdmin(admin.ModelAdmin):
    list_display = ("team", "source", "scheme", "name", "created_at", "expires_at", "revoked_at")
    list_filter = ("source", "scheme")
    exclude = ("secret_hash", "signing_secret")
    readonly_fields = ("created_at",)


@admin.register(SnsSubscription)
class SnsSubscriptionAdmin(admin.ModelAdmin):
    list_display = ("team", "topic_arn", "status", "confirmed_at", "unsubscribed_at")


@admin.register(AlertEndpoint)
class AlertEndpointAdmin(admin.ModelAdmin):
    list_display = ("team", "url", "format", "active", "created_at")
    exclude = ("signing_secret", "previous_signing_secret")


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin):
    list_display = ("endpoint", "event", "status", "attempts", "last_status_code", "next_attempt_at", "created_at")
    list_filter = ("status", "event")
