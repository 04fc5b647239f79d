"""The authorization matrix: every route of the site x every method x every kind of principal.

Principals: anonymous; a member and an admin of team A; an admin of team B; the agent token of team
A's instance that the URL names ("agent_own") and the agent token of another instance of team A
("agent_other"). Every object in a URL belongs to team A. The expected statuses come from the docs
(api.md, dashboard.md, webhooks.md, orchestration.md): 401 for anonymous API calls, a redirect to the
login form for anonymous pages, 404 (never 403) for another team's objects, 403 for a role or an
agent off its endpoints, webhooks authenticate with their own credentials only.

A route that the resolver knows and this table does not fails `test_every_route_has_a_row`, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern, URLResolver, get_resolver

from controlplane.observability import health
from tests.reliability.world import MARKER, PRINCIPALS, make_world

pytestmark = pytest.mark.django_db

# Routes deliberately outside the matrix, each with the reason.
EXCLUDED_PREFIXES = {
    "admin/": "Django admin: staff-only, guarded by Django's own admin_view (login + is_staff)",
    "static/": "static files",
}
EXCLUDED_ROUTES = {
    "api/v1/schema/": "the OpenAPI document is public by design (drf-spectacular's SERVE_PERMISSIONS)",
    "api/v1/docs/": "Swagger UI page over the public schema",
}

LOGIN = "/accounts/login/"


def E(anon: int, member_a: int, admin_a: int, member_b: int, agent_own: int, agent_other: int | None = None) -> dict:
    """Expected status per principal (agent_other defaults to agent_own's)."""
    return {"anon": anon, "member_a": member_a, "admin_a": admin_a, "member_b": member_b,
            "agent_own": agent_own, "agent_other": agent_own if agent_other is None else agent_other}


# Shorthands for the common shapes.
API_LIST = E(401, 200, 200, 200, 403)  # team-scoped list: B sees its own (empty) list
API_OBJ = E(401, 200, 200, 404, 403)  # team A object, users only
API_OBJ_AGENT = E(401, 200, 200, 404, 200, 404)  # team A object its agent may read
API_GLOBAL = E(401, 200, 200, 200, 403)  # market data, the same for every team
PAGE_LIST = E(302, 200, 200, 200, 302)  # anonymous and agents (no session) go to the login form
PAGE_OBJ = E(302, 200, 200, 404, 302)
DATA_LIST = E(401, 200, 200, 200, 401)
DATA_OBJ = E(401, 200, 200, 404, 401)
WEBHOOK = E(401, 401, 401, 401, 401)  # user and agent tokens are not webhook credentials


@dataclass(frozen=True)
class Row:
    route: str  # the resolver's pattern, as `all_routes()` spells it
    method: str
    url: str  # formatted with World.ids()
    expect: dict
    kind: str = "api"  # api: token header; page: session (browser)
    body: Any = None
    content_type: str = "application/json"


JOB_BODY = {"team": "{team}", "name": "new-job", "strategy": "recycle", "target_steps": 10, "budget_usd": "5.00",
            "model_spec": {"kind": "gpt", "layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64,
                           "global_batch": 8, "micro_batches": 2}}
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"  # the body's callables (a file to upload) are called once per case

ROWS: list[Row] = [
    # --- accounts
    Row("api/v1/^teams/$", "GET", "/api/v1/teams/", API_LIST),
    Row("api/v1/^teams/(?P<pk>[^/.]+)/$", "GET", "/api/v1/teams/{team}/", API_OBJ),
    # Creating a team is for staff users; no principal of the matrix is staff.
    Row("api/v1/^teams/$", "POST", "/api/v1/teams/", E(401, 403, 403, 403, 403),
        body={"name": "made-in-test", "admin": "made-in-test"}),
    Row("api/v1/^teams/(?P<pk>[^/.]+)/members/$", "GET", "/api/v1/teams/{team}/members/", API_OBJ),
    # The body names member A, already a member: the admin passes the role check and gets 409.
    Row("api/v1/^teams/(?P<pk>[^/.]+)/members/$", "POST", "/api/v1/teams/{team}/members/",
        E(401, 403, 409, 404, 403), body={"username": "{username}", "role": "member"}),
    Row("api/v1/^teams/(?P<pk>[^/.]+)/members/(?P<user_id>[0-9]{1,18})/$", "PATCH",
        "/api/v1/teams/{team}/members/{user}/", E(401, 403, 200, 404, 403), body={"role": "member"}),
    Row("api/v1/^teams/(?P<pk>[^/.]+)/members/(?P<user_id>[0-9]{1,18})/$", "DELETE",
        "/api/v1/teams/{team}/members/{user}/", E(401, 403, 204, 404, 403)),
    Row("api/v1/^tokens/$", "GET", "/api/v1/tokens/", API_LIST),
    Row("api/v1/^tokens/$", "POST", "/api/v1/tokens/", E(401, 403, 201, 400, 403),
        body={"team": "{team}", "kind": "user", "name": "made-in-test"}),
    Row("api/v1/^tokens/(?P<pk>[^/.]+)/$", "GET", "/api/v1/tokens/{token}/", API_OBJ),
    Row("api/v1/^tokens/(?P<pk>[^/.]+)/$", "DELETE", "/api/v1/tokens/{token}/", E(401, 204, 204, 404, 403)),
    # The URL's token is member A's: only its own user rotates it (an admin would get a key acting as them).
    Row("api/v1/^tokens/(?P<pk>[^/.]+)/rotate/$", "POST", "/api/v1/tokens/{token}/rotate/",
        E(401, 201, 403, 404, 403), body={}),
    # --- market (not team data)
    Row("api/v1/instance-types/", "GET", "/api/v1/instance-types/", API_GLOBAL),
    Row("api/v1/zones/", "GET", "/api/v1/zones/", API_GLOBAL),
    Row("api/v1/spot-prices/", "GET", "/api/v1/spot-prices/?instance_type=p3.2xlarge&zone=us-east-1a", API_GLOBAL),
    Row("api/v1/spot-prices/cheapest/", "GET", "/api/v1/spot-prices/cheapest/?instance_type=p3.2xlarge", API_GLOBAL),
    # The market is every team's: only staff users load prices, and no principal here is staff.
    Row("api/v1/spot-prices/upload/", "POST", "/api/v1/spot-prices/upload/", E(401, 403, 403, 403, 403),
        content_type=MULTIPART, body={"file": lambda: SimpleUploadedFile("prices.tsv", b"x")}),
    # --- fleet
    Row("api/v1/^instances/$", "GET", "/api/v1/instances/", API_LIST),
    Row("api/v1/^instances/(?P<pk>[^/.]+)/$", "GET", "/api/v1/instances/{instance}/", API_OBJ_AGENT),
    Row("api/v1/^instances/(?P<pk>[^/.]+)/events/$", "GET", "/api/v1/instances/{instance}/events/", API_OBJ),
    Row("api/v1/^instances/(?P<pk>[^/.]+)/heartbeat/$", "POST", "/api/v1/instances/{instance}/heartbeat/",
        E(401, 403, 403, 404, 200, 404), body={"agent_address": "10.0.0.1:7070"}),
    # Team admins only; the local provider has no such node to stop, so the row just ends.
    Row("api/v1/^instances/(?P<pk>[^/.]+)/terminate/$", "POST", "/api/v1/instances/{instance}/terminate/",
        E(401, 403, 200, 404, 403), body={"reason": "matrix"}),
    Row("api/v1/^notices/$", "GET", "/api/v1/notices/", API_LIST),
    Row("api/v1/^notices/(?P<pk>[^/.]+)/$", "GET", "/api/v1/notices/{notice}/", API_OBJ),
    # The matrix's notice is received, not failed: the admin passes the role check and gets 409.
    Row("api/v1/^notices/(?P<pk>[^/.]+)/retry/$", "POST", "/api/v1/notices/{notice}/retry/",
        E(401, 403, 409, 404, 403), body={}),
    # --- jobs
    Row("api/v1/^jobs/$", "GET", "/api/v1/jobs/", API_LIST),
    Row("api/v1/^jobs/$", "POST", "/api/v1/jobs/", E(401, 201, 201, 400, 403), body=JOB_BODY),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/$", "GET", "/api/v1/jobs/{job}/", API_OBJ_AGENT),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/cancel/$", "POST", "/api/v1/jobs/{job}/cancel/", E(401, 200, 200, 404, 403),
        body={}),
    # The job is pending: resume is refused with 409 after the authorization passed.
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/resume/$", "POST", "/api/v1/jobs/{job}/resume/", E(401, 409, 409, 404, 403),
        body={}),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/events/$", "GET", "/api/v1/jobs/{job}/events/", API_OBJ),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/generations/$", "GET", "/api/v1/jobs/{job}/generations/", API_OBJ_AGENT),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/metrics/$", "GET", "/api/v1/jobs/{job}/metrics/", API_OBJ_AGENT),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/metrics/$", "POST", "/api/v1/jobs/{job}/metrics/",
        E(401, 201, 201, 404, 201, 404), body={"samples": [{"step": 1, "loss": 2.5, "samples_per_s": 10.0}]}),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/reconfigurations/$", "GET", "/api/v1/jobs/{job}/reconfigurations/", API_OBJ),
    # --- billing
    Row("api/v1/billing/segments/", "GET", "/api/v1/billing/segments/", API_LIST),
    Row("api/v1/jobs/<int:pk>/cost-report/", "GET", "/api/v1/jobs/{job}/cost-report/", API_OBJ),
    Row("api/v1/teams/<int:pk>/spend/", "GET", "/api/v1/teams/{team}/spend/", API_OBJ),
    # A team's quota: its admins read and change it; its members are refused, another team's see nothing.
    Row("api/v1/teams/<str:pk>/quota/", "GET", "/api/v1/teams/{team}/quota/", E(401, 403, 200, 404, 403)),
    Row("api/v1/teams/<str:pk>/quota/", "PUT", "/api/v1/teams/{team}/quota/", E(401, 403, 200, 404, 403),
        body={"max_jobs": 50}),
    Row("api/v1/teams/<str:pk>/quota/", "PATCH", "/api/v1/teams/{team}/quota/", E(401, 403, 200, 404, 403),
        body={"max_nodes": 500}),
    Row("api/v1/^jobs/(?P<pk>[^/.]+)/artifacts/$", "GET", "/api/v1/jobs/{job}/artifacts/", API_OBJ),
    # The matrix's job has no weights yet: its own team gets 404 for the file too (a file that
    # exists is served to its team only: tests/controlplane/test_api_artifacts.py).
    Row("api/v1/jobs/<str:pk>/artifacts/<path:name>", "GET", "/api/v1/jobs/{job}/artifacts/model.safetensors",
        E(401, 404, 404, 404, 403)),
    # --- packages for jobs' requirements: a team's users upload; its users and agents download
    Row("api/v1/^packages/$", "POST", "/api/v1/packages/", E(401, 201, 201, 400, 403), content_type=MULTIPART,
        body={"team": "{team}", "file": lambda: SimpleUploadedFile("made_in_test-1.0-py3-none-any.whl", b"row")}),
    Row("api/v1/^packages/(?P<sha256>[0-9a-f]{64})/$", "GET", "/api/v1/packages/{package}/",
        E(401, 200, 200, 404, 200, 200)),
    # --- planning: an existing job of team A
    Row("api/v1/plans/", "POST", "/api/v1/plans/", E(401, 200, 200, 404, 403),
        body={"job": "{job}", "instance_types": ["p3.2xlarge"]}),
    # --- orchestration (agent protocol). Enrolment has no credential but its key: a wrong key is 403
    # for everyone, whatever token they hold.
    Row("api/v1/agents/enroll/", "POST", "/api/v1/agents/enroll/", E(403, 403, 403, 403, 403),
        body={"enroll_key": "1.forged", "provider_instance_id": "i-whatever"}),
    Row("api/v1/agents/commands/", "GET", "/api/v1/agents/commands/?wait=0", E(401, 403, 403, 403, 200)),
    Row("api/v1/agents/notices/", "POST", "/api/v1/agents/notices/", E(401, 403, 403, 403, 202),
        body={"kind": "rebalance", "cloud": "aws"}),
    Row("api/v1/agents/events/", "POST", "/api/v1/agents/events/", E(401, 403, 403, 403, 202),
        body={"kind": "worker_started", "generation": 0}),
    # A profile of the agent's job's model: agents only; the matrix's job does not wait for one (409).
    Row("api/v1/agents/profile/", "POST", "/api/v1/agents/profile/", E(401, 403, 403, 403, 409),
        body={"layers": 1, "layer_measures": [{"parameters": 1, "forward_flops": 1.0, "activation_bytes": 1.0,
                                               "output_bytes": 1.0, "kernels": 1, "input_grad": False}]}),
    # The prepare step's shares: agents only; the matrix's job has no prepare step (nothing to claim: 200
    # "prepared"; a share report: 409).
    Row("api/v1/agents/prepare/claim/", "POST", "/api/v1/agents/prepare/claim/", E(401, 403, 403, 403, 200),
        body={}),
    Row("api/v1/agents/prepare/done/", "POST", "/api/v1/agents/prepare/done/", E(401, 403, 403, 403, 409),
        body={"share": 0, "of": 1, "index_written": True}),
    # What launches skip now: every team's no-capacity marks and the reader's teams' cool-downs.
    Row("api/v1/offerings/unavailable/", "GET", "/api/v1/offerings/unavailable/", API_GLOBAL),
    # Rotation: agent tokens only; each agent rotates its own (the token names the instance).
    Row("api/v1/agents/token/", "POST", "/api/v1/agents/token/", E(401, 403, 403, 403, 201), body={}),
    # --- webhook management: members read, admins write; secrets shown once (webhooks.md)
    Row("api/v1/^alert-endpoints/$", "GET", "/api/v1/alert-endpoints/", API_LIST),
    Row("api/v1/^alert-endpoints/$", "POST", "/api/v1/alert-endpoints/", E(401, 403, 201, 400, 403),
        body={"team": "{team}", "url": "https://hooks.example.com/made-in-test", "format": "slack"}),
    Row("api/v1/^alert-endpoints/(?P<pk>[^/.]+)/$", "GET", "/api/v1/alert-endpoints/{alert}/", API_OBJ),
    Row("api/v1/^alert-endpoints/(?P<pk>[^/.]+)/$", "PATCH", "/api/v1/alert-endpoints/{alert}/",
        E(401, 403, 200, 404, 403), body={"active": False}),
    Row("api/v1/^alert-endpoints/(?P<pk>[^/.]+)/$", "DELETE", "/api/v1/alert-endpoints/{alert}/",
        E(401, 403, 204, 404, 403)),
    Row("api/v1/^alert-endpoints/(?P<pk>[^/.]+)/rotate-secret/$", "POST",
        "/api/v1/alert-endpoints/{alert}/rotate-secret/", E(401, 403, 200, 404, 403), body={"grace_hours": 1}),
    Row("api/v1/^webhook-credentials/$", "GET", "/api/v1/webhook-credentials/", API_LIST),
    Row("api/v1/^webhook-credentials/$", "POST", "/api/v1/webhook-credentials/", E(401, 403, 201, 400, 403),
        body={"team": "{team}", "source": "generic", "scheme": "standard_webhooks"}),
    Row("api/v1/^webhook-credentials/(?P<pk>[^/.]+)/$", "GET", "/api/v1/webhook-credentials/{credential}/",
        API_OBJ),
    Row("api/v1/^webhook-credentials/(?P<pk>[^/.]+)/$", "DELETE", "/api/v1/webhook-credentials/{credential}/",
        E(401, 403, 204, 404, 403)),
    Row("api/v1/^webhook-credentials/(?P<pk>[^/.]+)/rotate/$", "POST",
        "/api/v1/webhook-credentials/{credential}/rotate/", E(401, 403, 201, 404, 403), body={"grace_hours": 1}),
    # --- webhooks: the team's webhook credential is the only key
    *[Row(f"api/v1/webhooks/{p}/<slug:team_slug>/", "POST", f"/api/v1/webhooks/{p}/{{slug}}/", WEBHOOK,
          body={"version": "0", "detail-type": "EC2 Spot Instance Interruption Warning"})
      for p in ("aws/eventbridge", "aws/sns", "gcp", "azure", "notice")],
    # --- observability: SPOTPIPE_METRICS_TOKEN is set in the test; no principal holds it
    Row("metrics", "GET", "/metrics", E(401, 401, 401, 401, 401), kind="page"),
    Row("healthz", "GET", "/healthz", E(200, 200, 200, 200, 200), kind="page"),
    # --- login/logout
    # A logged-in user is sent on from the login form (redirect_authenticated_user).
    Row("accounts/login/", "GET", "/accounts/login/", E(200, 302, 302, 302, 200), kind="page"),
    Row("accounts/login/", "POST", "/accounts/login/", E(200, 302, 302, 302, 200), kind="page",
        body={"username": "nobody", "password": "wrong-password"}, content_type=FORM),
    Row("accounts/logout/", "POST", "/accounts/logout/", E(302, 302, 302, 302, 302), kind="page", body={},
        content_type=FORM),
    # --- dashboard pages
    Row("", "GET", "/", PAGE_LIST, kind="page"),
    Row("prices/", "GET", "/prices/", PAGE_LIST, kind="page"),
    Row("fleet/", "GET", "/fleet/", PAGE_LIST, kind="page"),
    Row("jobs/", "GET", "/jobs/", PAGE_LIST, kind="page"),
    Row("notices/", "GET", "/notices/", PAGE_LIST, kind="page"),
    # Page actions of team admins (issue 21): a member's POST is 403, another team's object 404.
    # The local provider has no such node to stop, so the instance just ends.
    Row("fleet/instances/<int:instance_id>/terminate/", "POST", "/fleet/instances/{instance}/terminate/",
        E(302, 403, 302, 404, 302), kind="page", body={"reason": "matrix"}, content_type=FORM),
    # The matrix's notice is received, not failed: the admin passes the role check and gets a message.
    Row("notices/<int:notice_id>/retry/", "POST", "/notices/{notice}/retry/", E(302, 403, 302, 404, 302),
        kind="page", body={}, content_type=FORM),
    Row("jobs/new/", "GET", "/jobs/new/", PAGE_LIST, kind="page"),
    Row("jobs/<int:job_id>/", "GET", "/jobs/{job}/", PAGE_OBJ, kind="page"),
    Row("jobs/<int:job_id>/cancel/", "POST", "/jobs/{job}/cancel/", E(302, 302, 302, 404, 302), kind="page",
        body={}, content_type=FORM),
    Row("jobs/<int:job_id>/resume/", "POST", "/jobs/{job}/resume/", E(302, 302, 302, 404, 302), kind="page",
        body={}, content_type=FORM),
    Row("jobs/<int:job_id>/cost/", "GET", "/jobs/{job}/cost/", PAGE_OBJ, kind="page"),
    # Downloads answer like data endpoints (401 JSON, not a redirect): a script fetching a CSV is not a browser.
    Row("jobs/<int:job_id>/cost.csv", "GET", "/jobs/{job}/cost.csv", DATA_OBJ, kind="page"),
    Row("jobs/<int:job_id>/cost.json", "GET", "/jobs/{job}/cost.json", DATA_OBJ, kind="page"),
    # The team list sends a user on to their (first) team's page.
    Row("team/", "GET", "/team/", E(302, 302, 302, 302, 302), kind="page"),
    Row("team/<slug:slug>/", "GET", "/team/{slug}/", PAGE_OBJ, kind="page"),
    Row("team/<slug:slug>/members/", "POST", "/team/{slug}/members/", E(302, 403, 302, 404, 302), kind="page",
        body={"username": "nobody-such", "role": "member"}, content_type=FORM),
    Row("team/<slug:slug>/members/<int:user_id>/remove/", "POST", "/team/{slug}/members/{user}/remove/",
        E(302, 403, 302, 404, 302), kind="page", body={}, content_type=FORM),
    Row("team/<slug:slug>/members/<int:user_id>/role/", "POST", "/team/{slug}/members/{user}/role/",
        E(302, 403, 302, 404, 302), kind="page", body={"role": "member"}, content_type=FORM),
    # Creating a token or an alert URL answers the page itself (200) with the new secret shown once:
    # a redirect would carry it in the messages cookie.
    Row("team/<slug:slug>/tokens/", "POST", "/team/{slug}/tokens/", E(302, 403, 200, 404, 302), kind="page",
        body={"name": "from-page"}, content_type=FORM),
    Row("team/<slug:slug>/tokens/<int:token_id>/revoke/", "POST", "/team/{slug}/tokens/{token}/revoke/",
        E(302, 403, 302, 404, 302), kind="page", body={}, content_type=FORM),
    # The URL's token is member A's: only its own user rotates it (the new key in the page, 200).
    Row("team/<slug:slug>/tokens/<int:token_id>/rotate/", "POST", "/team/{slug}/tokens/{token}/rotate/",
        E(302, 200, 403, 404, 302), kind="page", body={}, content_type=FORM),
    # The team's spend report: every member downloads it, like the job cost downloads.
    Row("team/<slug:slug>/spend.csv", "GET", "/team/{slug}/spend.csv", DATA_OBJ, kind="page"),
    Row("team/<slug:slug>/spend.json", "GET", "/team/{slug}/spend.json", DATA_OBJ, kind="page"),
    Row("team/<slug:slug>/alerts/", "POST", "/team/{slug}/alerts/", E(302, 403, 200, 404, 302), kind="page",
        body={"url": "https://hooks.example.com/x", "format": "generic"}, content_type=FORM),
    # --- dashboard data endpoints
    Row("data/overview.json", "GET", "/data/overview.json", DATA_LIST, kind="page"),
    Row("data/prices.json", "GET", "/data/prices.json", DATA_LIST, kind="page"),
    Row("data/fleet.json", "GET", "/data/fleet.json", DATA_LIST, kind="page"),
    Row("data/jobs.json", "GET", "/data/jobs.json", DATA_LIST, kind="page"),
    Row("data/notices.json", "GET", "/data/notices.json", DATA_LIST, kind="page"),
    Row("data/jobs/<int:job_id>.json", "GET", "/data/jobs/{job}.json", DATA_OBJ, kind="page"),
    Row("data/jobs/<int:job_id>/cost.json", "GET", "/data/jobs/{job}/cost.json", DATA_OBJ, kind="page"),
]


# --- route enumeration -------------------------------------------------------------------------


def _walk(patterns: list, prefix: str = ""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.callback


def _excluded(route: str) -> bool:
    return route in EXCLUDED_ROUTES or any(route.startswith(p) for p in EXCLUDED_PREFIXES)


def all_routes(urlconf: Any = None) -> dict[str, Any]:
    """Every route the resolver serves (outside the exclusions): pattern -> view callback."""
    return {route: cb for route, cb in _walk(get_resolver(urlconf).url_patterns) if not _excluded(route)}


def drf_methods(callback: Any) -> set[str] | None:
    """The methods a DRF view implements (None for a plain Django view, where only the table knows)."""
    if getattr(callback, "actions", None):  # a viewset route: {"get": "list", ...}
        # DRF adds "head" to this dict on the first GET it serves; HEAD is GET without a body.
        return {m.upper() for m in callback.actions if m not in {"options", "head"}}
    cls = getattr(callback, "cls", None)
    if cls is None:
        return None
    return {m.upper() for m in cls.http_method_names if m not in {"options", "head"} and hasattr(cls, m)}


def missing_rows(routes: dict[str, Any], rows: list[Row]) -> list[str]:
    """Routes (or route + method, for DRF views) that have no row in the table."""
    covered: dict[str, set[str]] = {}
    for row in rows:
        covered.setdefault(row.route, set()).add(row.method)
    missing = []
    for route, callback in sorted(routes.items()):
        if route not in covered:
            missing.append(f"{route!r} (view {callback.__module__}.{callback.__name__})")
            continue
        for method in sorted((drf_methods(callback) or set()) - covered[route]):
            missing.append(f"{method} {route!r}")
    return missing


def test_every_route_has_a_row():
    missing = missing_rows(all_routes(), ROWS)
    assert not missing, "routes without a row in the authorization matrix:\n  " + "\n  ".join(missing)
    stale = {row.route for row in ROWS} - set(all_routes())
    assert not stale, f"rows for routes that no longer exist: {sorted(stale)}"


def test_a_new_route_without_a_row_is_named():
    """The guard itself: a route added to the site is reported by name until it gets a row."""
    from django.http import HttpResponse
    from django.urls import path

    routes = dict(all_routes())
    routes["api/v1/brand-new/"] = path("api/v1/brand-new/", lambda r: HttpResponse()).callback
    assert any("api/v1/brand-new/" in m for m in missing_rows(routes, ROWS))
    # And a DRF viewset route is checked method by method.
    jobs_route = "api/v1/^jobs/$"
    without_post = [r for r in ROWS if not (r.route == jobs_route and r.method == "POST")]
    assert f"POST {jobs_route!r}" in missing_rows(all_routes(), without_post)


# --- the matrix --------------------------------------------------------------------------------


def _fill(value: Any, ids: dict) -> Any:
    if callable(value):
        return value()
    if isinstance(value, str):
        return value.format(**ids) if "{" in value else value
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


def _coerce_ids(body: Any) -> Any:
    """Body ids written as "{job}" become ints once formatted."""
    if isinstance(body, dict):
        return {k: (int(v) if k in {"team", "job", "instance"} and isinstance(v, str) and v.isdigit() else
                    _coerce_ids(v)) for k, v in body.items()}
    return body


@pytest.fixture
def ops_env(monkeypatch):
    """/metrics behind a token nobody in the matrix has; /healthz with a stand-in worker check
    (a real ping waits its full timeout)."""
    monkeypatch.setenv("SPOTPIPE_METRICS_TOKEN", "matrix-metrics-token")
    monkeypatch.setitem(health.CHECKS, "workers", lambda: health.Check(ok=True, latency_ms=0.0, detail="stub"))


# Cells where the code disagrees with the documented behaviour, reported for a fix. Each stays
# `xfail(strict=True)` against the DOCUMENTED status: when the code is fixed the cell passes, strict
# xfail turns that into a failure, and the entry must be removed here. (docs/reliability.md lists them.)
# (The agent-token cells of the market and planner routes were here; fixed.)
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def _case(row: Row, principal: str):
    reason = KNOWN_BUGS.get((row.route, row.method)) if principal.startswith("agent") else None
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(row, principal, marks=marks, id=f"{row.method} {row.url} as {principal}")


CASES = [_case(row, principal) for row in ROWS for principal in PRINCIPALS]


@pytest.mark.parametrize(("row", "principal"), CASES)
def test_matrix(row: Row, principal: str, ops_env):
    world = make_world()
    ids = world.ids()
    url = row.url.format(**ids)
    client = world.api_client(principal) if row.kind == "api" else world.session_client(principal)
    kwargs: dict[str, Any] = {}
    if row.body is not None:
        body = _coerce_ids(_fill(row.body, ids))
        if row.content_type == "application/json":
            kwargs = {"data": body, "content_type": "application/json"}
        else:
            kwargs = {"data": body}
    response = getattr(client, row.method.lower())(url, **kwargs)
    expected = row.expect[principal]
    assert response.status_code == expected, (
        f"{row.method} {url} as {principal}: {response.status_code}, expected {expected}; "
        f"body: {response.content[:300]!r}"
    )
    if expected == 302 and principal in {"anon", "agent_own", "agent_other"} and row.route not in {
        "accounts/logout/"
    }:
        assert response["Location"].startswith(LOGIN), f"{url} as {principal} redirected to {response['Location']}"
    if principal == "member_b":
        # Team B is never shown anything of team A's, whatever the status.
        assert MARKER not in response.content.decode(errors="replace"), f"{url} shows team A's data to team B"
