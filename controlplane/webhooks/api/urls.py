"""API routes of this app, mounted under /api/v1/webhooks/. The team is part of each URL; the
credential it is configured with authenticates the sender."""


from django.urls import path

from controlplane.tunables import tunable
from controlplane.webhooks import views

app_name = "webhooks"

urlpatterns = [
    path("aws/eventbridge/<slug:team_slug>/", views.aws_eventbridge, name="aws-eventbridge"),
    path("aws/sns/<slug:team_slug>/", views.aws_sns, name="aws-sns"),
    path("gcp/<slug:team_slug>/", views.gcp, name="gcp"),
    path("azure/<slug:team_slug>/", views.azure, name="azure"),
    path("notice/<slug:team_slug>/", views.generic_notice, name="notice"),
]

if tunable("SPOTPIPE_BENCH_ENDPOINTS"):  # `python -m bench webhooks` only
    urlpatterns.append(path("bench/parse-only/", views.bench_parse_only, name="bench-parse-only"))
