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


def test_every_operation_documents_its_error_answers_with_their_body(tmp_path):
    """One owner (common/schema.py): each operation lists 400/401/403/404/429 (and 409/415 when it
    changes state) with the API's error body, so a client can trust any status it gets."""
    schema = _generate(tmp_path)
    assert schema["components"]["schemas"]["ApiError"]["required"] == ["detail", "errors"]
    operations = [(path, method, op) for path, methods in schema["paths"].items()
                  for method, op in methods.items() if method in {"get", "post", "patch", "put", "delete"}]
    assert len(operations) > 60
    for path, method, op in operations:
        if path.startswith("/api/v1/webhooks/"):  # webhooks/schema.py: the receivers' own answers
            expected = {"400", "401", "404", "413", "415", "429"}
        else:
            expected = {"400", "401", "403", "404", "429"} | ({"409", "415"} if method != "get" else set())
        assert expected <= set(op["responses"]), (method, path, sorted(op["responses"]))
        for code in expected:
            body = op["responses"][code]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ApiError"}, (method, path, code)


def test_webhook_intake_is_in_the_schema_with_its_credentials(tmp_path):
    schema = _generate(tmp_path)
    paths = schema["paths"]
    for source in ("aws/eventbridge", "aws/sns", "gcp", "azure", "notice"):
        assert "post" in paths[f"/api/v1/webhooks/{source}/{{team_slug}}/"], source
    eventbridge = paths["/api/v1/webhooks/aws/eventbridge/{team_slug}/"]["post"]
    assert {"webhookApiKey": []} in eventbridge["security"]
    event = eventbridge["requestBody"]["content"]["application/json"]["schema"]
    assert len(event["oneOf"]) == 3  # spot warning, rebalance, state change
    notice = paths["/api/v1/webhooks/notice/{team_slug}/"]["post"]
    assert {p["name"] for p in notice["parameters"] if p["in"] == "header"} == {
        "webhook-id", "webhook-timestamp", "webhook-signature"}
    # Bodies of the API's own views are JSON; only the uploads take multipart.
    assert set(paths["/api/v1/jobs/"]["post"]["requestBody"]["content"]) == {"application/json"}
    assert "multipart/form-data" in paths["/api/v1/packages/"]["post"]["requestBody"]["content"]
    page_size = {p["name"]: p for p in paths["/api/v1/jobs/"]["get"]["parameters"]}["page_size"]
    assert page_size["schema"]["minimum"] == 1


def test_page_size_that_is_not_a_whole_number_from_1_is_a_400(client):
    from tests.controlplane.api_helpers import make_api_token, make_api_user
    from tests.controlplane.factories import make_team

    team = make_team("pages")
    key = make_api_token(team, user=make_api_user(team))
    for value in ("null", "0", "-1", "abc", "1.5"):
        response = client.get(f"/api/v1/jobs/?page_size={value}", HTTP_AUTHORIZATION=f"Token {key}")
        assert response.status_code == 400 and "page_size" in response.json()["errors"], value
    assert client.get("/api/v1/jobs/?page_size=9999", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200


def test_an_unrouted_api_path_is_a_json_404(client):
    for path in ("/api/v1/nothing-here/", "/api/v1/webhooks/gcp/no%20slug/"):
        response = client.post(path, {}, content_type="application/json")
        assert response.status_code == 404 and response["Content-Type"] == "application/json", path
        assert "detail" in response.json()
