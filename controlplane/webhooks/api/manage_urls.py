"""Management routes of this app, mounted under /api/v1/: a team's alert endpoints and inbound
webhook credentials (the receivers themselves are in `urls.py`, under /api/v1/webhooks/)."""

from rest_framework.routers import SimpleRouter

from controlplane.webhooks.api.views import AlertEndpointViewSet, WebhookCredentialViewSet

router = SimpleRouter()
router.register("alert-endpoints", AlertEndpointViewSet, basename="alertendpoint")
router.register("webhook-credentials", WebhookCredentialViewSet, basename="webhookcredential")

urlpatterns = router.urls
