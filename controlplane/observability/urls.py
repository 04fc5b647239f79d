"""`/metrics` (Prometheus text format) and `/healthz` (JSON). Mounted at the site root."""

from django.urls import path

from controlplane.observability import views

urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
    path("healthz", views.healthz_view, name="healthz"),
]
