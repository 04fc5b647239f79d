"""API routes of this app, mounted under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.jobs.api.cost import JobCostReport
from controlplane.jobs.api.packages import PackageViewSet
from controlplane.jobs.api.plans import PlanView
from controlplane.jobs.api.quota import TeamQuotaView
from controlplane.jobs.api.views import JobViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("packages", PackageViewSet, basename="package")

urlpatterns = [
    # A file of the job's artifacts: its name as is (no trailing slash), in the folder or its hf/ folder.
    path("jobs/<str:pk>/artifacts/<path:name>", JobViewSet.as_view({"get": "artifact_download"}),
         name="job-artifact-download"),
    path("jobs/<int:pk>/cost-report/", JobCostReport.as_view(), name="job-cost-report"),
    path("plans/", PlanView.as_view(), name="plan"),
    path("teams/<str:pk>/quota/", TeamQuotaView.as_view(), name="team-quota"),
    *router.urls,
]
