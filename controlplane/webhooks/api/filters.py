"""Query filters of `/alert-endpoints/` and `/webhook-credentials/`."""

from __future__ import annotations

from django_filters import rest_framework as filters

from controlplane.common.filters import BooleanFilter, OrderingFilter, id_filter, live_filter
from controlplane.webhooks.models import AlertEndpoint, WebhookCredential, WebhookSource


class AlertEndpointFilter(filters.FilterSet):
    team = id_filter("team_id")
    active = BooleanFilter()
    ordering = OrderingFilter("created_at")

    class Meta:
        model = AlertEndpoint
        fields: list[str] = []


class WebhookCredentialFilter(filters.FilterSet):
    team = id_filter("team_id")
    source = filters.ChoiceFilter(choices=WebhookSource.choices)
    active = live_filter()
    ordering = OrderingFilter("created_at")

    class Meta:
        model = WebhookCredential
        fields: list[str] = []
