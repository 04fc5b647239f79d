"""API routes of this app, mounted under /api/v1/: the node agent protocol."""

from django.urls import path

from controlplane.orchestration.api.views import (
    AgentEventView,
    AgentNoticeView,
    AgentTokenView,
    CommandsView,
    EnrollView,
    UnavailableOfferingsView,
)

urlpatterns = [
    path("agents/enroll/", EnrollView.as_view(), name="agent-enroll"),
    path("agents/token/", AgentTokenView.as_view(), name="agent-token"),
    path("agents/commands/", CommandsView.as_view(), name="agent-commands"),
    path("agents/notices/", AgentNoticeView.as_view(), name="agent-notices"),
    path("agents/events/", AgentEventView.as_view(), name="agent-events"),
    path("offerings/unavailable/", UnavailableOfferingsView.as_view(), name="offerings-unavailable"),
]
