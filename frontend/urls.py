"""Dashboard routes, mounted at the site root. Each page has a data endpoint under /data/."""

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import actions, data, spend, team, views

app_name = "frontend"

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(template_name="frontend/login.html",
                                                         redirect_authenticated_user=True,
                                                         next_page="frontend:overview"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="frontend:login"), name="logout"),
    path("", views.overview, name="overview"),
    path("prices/", views.prices, name="prices"),
    path("fleet/", views.fleet, name="fleet"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel_view, name="job-cancel"),
    path("jobs/<int:job_id>/resume/", views.job_resume_view, name="job-resume"),
    path("jobs/<int:job_id>/cost/", views.job_cost, name="job-cost"),
    path("jobs/<int:job_id>/cost.csv", data.job_cost_csv, name="job-cost-csv"),
    path("jobs/<int:job_id>/cost.json", data.job_cost_json_download, name="job-cost-json"),
    path("fleet/instances/<int:instance_id>/terminate/", actions.instance_terminate_view, name="instance-terminate"),
    path("notices/", views.notices, name="notices"),
    path("notices/<int:notice_id>/retry/", actions.notice_retry_view, name="notice-retry"),
    path("team/", team.team_list, name="team-list"),
    path("team/<slug:slug>/", team.team_detail, name="team"),
    path("team/<slug:slug>/members/", team.member_add, name="team-member-add"),
    path("team/<slug:slug>/members/<int:user_id>/remove/", team.member_remove, name="team-member-remove"),
    path("team/<slug:slug>/members/<int:user_id>/role/", team.member_role, name="team-member-role"),
    path("team/<slug:slug>/tokens/", team.token_create, name="team-token-create"),
    path("team/<slug:slug>/tokens/<int:token_id>/revoke/", team.token_revoke, name="team-token-revoke"),
    path("team/<slug:slug>/tokens/<int:token_id>/rotate/", team.token_rotate, name="team-token-rotate"),
    path("team/<slug:slug>/spend.csv", spend.team_spend_csv, name="team-spend-csv"),
    path("team/<slug:slug>/spend.json", spend.team_spend_json, name="team-spend-json"),
    path("team/<slug:slug>/alerts/", team.alert_add, name="team-alert-add"),
    path("data/overview.json", data.overview_data, name="overview-data"),
    path("data/prices.json", data.prices_data, name="prices-data"),
    path("data/fleet.json", data.fleet_data, name="fleet-data"),
    path("data/jobs.json", data.jobs_data, name="jobs-data"),
    path("data/jobs/<int:job_id>.json", data.job_data, name="job-data"),
    path("data/jobs/<int:job_id>/cost.json", data.job_cost_data, name="job-cost-data"),
    path("data/notices.json", data.notices_data, name="notices-data"),
]
