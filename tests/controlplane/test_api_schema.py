"""The OpenAPI schema generates without warnings or errors, documents every route, and the
docs page loads."""

from __future__ import annotations

import pytest
import yaml
from django.core.management import call_command

pytestmark = pytest.mark.django_db

def _generate(tmp_path) -> dict:
    """`manage.py spectacular --validate --fail-on-warn` (raises on any warning or error)."""
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    return yaml.safe_load(out.read_text())


def test_schema_validates_without_warnings_and_lists_every_route(tmp_path):
    schema = _generate(tmp_path)
    paths = schema["paths"]
    for path, methods in {
        "/api/v1/teams/": {"get", "post"},
        "/api/v1/teams/{id}/": {"get"},
        "/api/v1/tokens/": {"get", "post"},
        "/api/v1/tokens/{id}/": {"get", "delete"},
        "/api/v1/tokens/{id}/rotate/": {"post"},
        "/api/v1/jobs/": {"get", "post"},
        "/api/v1/jobs/{id}/": {"get"},
        "/api/v1/jobs/{id}/cancel/": {"post"},
        "/api/v1/jobs/{id}/resume/": {"post"},
        "/api/v1/jobs/{id}/generations/": {"get"},
        "/api/v1/jobs/{id}/reconfigurations/": {"get"},
        "/api/v1/jobs/{id}/events/": {"get"},
        "/api/v1/jobs/{id}/metrics/": {"get", "post"},
        "/api/v1/jobs/{id}/artifacts/": {"get"},
        "/api/v1/jobs/{id}/artifacts/{name}": {"get"},
        "/api/v1/instances/": {"get"},
        "/api/v1/instances/{id}/": {"get"},
        "/api/v1/instances/{id}/events/": {"get"},
        "/api/v1/instances/{id}/heartbeat/": {"post"},
        "/api/v1/instances/{id}/terminate/": {"post"},
        "/api/v1/notices/": {"get"},
        "/api/v1/notices/{id}/": {"get"},
        "/api/v1/notices/{id}/retry/": {"post"},
        "/api/v1/spot-prices/upload/": {"post"},
        "/api/v1/teams/{id}/spend/": {"get"},
        "/api/v1/teams/{id}/members/": {"get", "post"},
        "/api/v1/teams/{id}/members/{user_id}/": {"patch", "delete"},
    }.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))
    # Filters are documented with their allowed values.
    params = {p["name"]: p for p in paths["/api/v1/jobs/"]["get"]["parameters"]}
    assert {"status", "strategy", "search", "ordering", "page", "page_size"} <= set(params)
    assert "running" in params["status"]["schema"]["enum"]
    assert "tokenAuth" in schema["components"]["securitySchemes"]
    assert schema["components"]["schemas"]["TokenKindEnum"]["enum"] == ["user", "agent"]
    # The created token (with its key) is a distinct response shape.
    created = paths["/api/v1/tokens/"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert created["$ref"].endswith("/ApiTokenCreated")


def test_schema_endpoint_and_docs_page_load(client):
    from tests.controlplane.api_helpers import make_api_user

    response = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert b"/api/v1/jobs/{id}/metrics/" in response.content
    client.force_login(make_api_user())
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content and b"/api/v1/schema/" in docs.content
