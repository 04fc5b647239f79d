"""API routes of this app, mounted under /api/v1/: the node agent protocol, and terminating an
instance (the rest of `/instances/` is fleet's)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.orchestration.api.views import (
    AgentEventView,
    AgentNoticeView,
    AgentProfileView,
    AgentShareClaimView,
    AgentShareReportView,
    AgentTokenView,
    CommandsView,
    EnrollView,
    InstanceTerminateViewSet,
    UnavailableOfferingsView,
)

router = SimpleRouter()
router.register("instances", InstanceTerminateViewSet, basename="instance")

urlpatterns = [
    path("agents/enroll/", EnrollView.as_view(), name="agent-enroll"),
    path("agents/token/", AgentTokenView.as_view(), name="agent-token"),
    path("agents/commands/", CommandsView.as_view(), name="agent-commands"),
    path("agents/notices/", AgentNoticeView.as_view(), name="agent-notices"),
    path("agents/events/", AgentEventView.as_view(), name="agent-events"),
    path("agents/profile/", AgentProfileView.as_view(), name="agent-profile"),
    path("agents/prepare/claim/", AgentShareClaimView.as_view(), name="agent-prepare-claim"),
    path("agents/prepare/done/", AgentShareReportView.as_view(), name="agent-prepare-done"),
    path("offerings/unavailable/", UnavailableOfferingsView.as_view(), name="offerings-unavailable"),
    *router.urls,
]
