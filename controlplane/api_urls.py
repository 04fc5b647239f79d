"""Routes of /api/v1/. Each app contributes its own routes in `<app>/api/urls.py`."""

from django.urls import include, path

urlpatterns = [
    # First: the webhook receivers are the busiest routes, and resolving walks the list in order.
    path("webhooks/", include("controlplane.webhooks.api.urls")),
    path("", include("controlplane.accounts.api.urls")),
    path("", include("controlplane.market.api.urls")),
    path("", include("controlplane.fleet.api.urls")),
    path("", include("controlplane.jobs.api.urls")),
    path("", include("controlplane.billing.api.urls")),
    path("", include("controlplane.orchestration.api.urls")),
    path("", include("controlplane.webhooks.api.manage_urls")),
]
