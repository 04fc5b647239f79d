"""API routes of this app, mounted under /api/v1/."""

from rest_framework.routers import SimpleRouter

from controlplane.accounts.api.views import ApiTokenViewSet, TeamViewSet

router = SimpleRouter()
router.register("teams", TeamViewSet, basename="team")
router.register("tokens", ApiTokenViewSet, basename="apitoken")

urlpatterns = router.urls
