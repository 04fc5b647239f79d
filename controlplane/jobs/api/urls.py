"""API routes of this app, mounted under /api/v1/."""

from rest_framework.routers import SimpleRouter

from controlplane.jobs.api.views import JobViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = router.urls
