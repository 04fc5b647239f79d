"""API routes of this app, mounted under /api/v1/."""

from django.urls import path

from controlplane.billing.api import views

urlpatterns = [
    path("billing/segments/", views.BillingSegmentList.as_view(), name="billing-segment-list"),
    path("teams/<int:pk>/spend/", views.TeamSpendReport.as_view(), name="team-spend-report"),
]
