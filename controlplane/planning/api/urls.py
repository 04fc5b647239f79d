"""API routes of this app, mounted under /api/v1/."""

from django.urls import path

from controlplane.planning.api.views import PlanView

urlpatterns = [path("plans/", PlanView.as_view(), name="plan")]
