"""API routes of this app, mounted under /api/v1/."""

from rest_framework.routers import SimpleRouter

from controlplane.fleet.api.views import InstanceViewSet, NoticeViewSet

router = SimpleRouter()
router.register("instances", InstanceViewSet, basename="instance")
router.register("notices", NoticeViewSet, basename="notice")

urlpatterns = router.urls
