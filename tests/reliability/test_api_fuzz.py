"""Schemathesis against /api/v1/schema/, in process (WSGI), as an authenticated admin of team A.

Checks on every generated request: no 5xx (`not_a_server_error`) and the response conforms to the
documented schema for its status (`response_schema_conformance`). Half of the cases that carry a
path id are pointed at team A's real objects, so the generated inputs reach the views' logic rather
than stopping at a 404.

Size: 5 examples per operation by default (the quick set CI runs, well under a minute);
SPOTPIPE_FUZZ_FULL=1 runs 25 per operation and then requires >= 500 requests in all (the issue's
bar); SPOTPIPE_FUZZ_EXAMPLES=N overrides both. Derandomized, so a failure reproduces with the same
command.

The server errors it found (out-of-range integers reaching the database) are fixed; the tests at
the end pin each exact request to its 400 / non-5xx answer.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from controlplane.wsgi import application
from tests.reliability.world import make_world

FULL = os.environ.get("SPOTPIPE_FUZZ_FULL", "") not in {"", "0"}
EXAMPLES = int(os.environ.get("SPOTPIPE_FUZZ_EXAMPLES", "25" if FULL else "5"))

MIN_REQUESTS = 500  # the bar; the coverage phase alone sends well over it

schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", application)
# test_fuzz_volume counts what the module's fuzz cases sent: one process, in file order.
pytestmark = pytest.mark.serial

SENT: list[str] = []  # "METHOD path -> status" of every request, for the total below
SERVER_ERRORS: list[str] = []


@pytest.fixture
def fuzz_world(db):
    """Team A's objects; requests run inside the test's transaction. Django's test client keeps
    `close_old_connections` off the request signals for that reason; schemathesis calls the WSGI app
    directly, so do the same (else PostgreSQL's connection, and the transaction, is closed after
    the first request)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield make_world()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _real_ids(world) -> dict[str, int]:
    """Path prefix -> an id of team A's object there."""
    return {
        "/api/v1/teams/": world.team_a.pk, "/api/v1/tokens/": world.member_a_token.pk,
        "/api/v1/instances/": world.instance.pk, "/api/v1/notices/": world.notice.pk,
        "/api/v1/jobs/": world.job.pk,
    }


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_api_fuzz(case, fuzz_world):
    world = fuzz_world
    if case.path_parameters and len(SENT) % 2 == 0:
        for prefix, pk in _real_ids(world).items():
            if case.path.startswith(prefix):
                for name in case.path_parameters:
                    case.path_parameters[name] = pk
    key = world.keys["admin_a"]
    response = case.call(headers={"Authorization": f"Token {key}"})
    SENT.append(f"{case.method} {case.formatted_path} -> {response.status_code}")
    if response.status_code >= 500:
        SERVER_ERRORS.append(f"{case.method} {case.formatted_path} body={case.body!r} query={case.query!r}")
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])


def test_fuzz_volume():
    """Runs after the fuzz cases (same module, file order): the run sent enough requests and no
    server error slipped through."""
    statuses: dict[str, int] = {}
    for line in SENT:
        status = line.rsplit(" ", 1)[-1]
        statuses[status] = statuses.get(status, 0) + 1
    print(f"\nschemathesis: {len(SENT)} requests, statuses {dict(sorted(statuses.items()))}")
    assert len(SENT) >= MIN_REQUESTS, f"only {len(SENT)} generated requests, the bar is {MIN_REQUESTS}"
    assert not SERVER_ERRORS, SERVER_ERRORS
    assert not any(s.startswith("5") for s in statuses), statuses


# --- the server errors the fuzzer found (fixed), each pinned to its exact request ------------------


@pytest.mark.parametrize("generation", [2**31, 2**64])
def test_metrics_generation_out_of_range_is_a_400(db, generation):
    world = make_world()
    client = world.api_client("admin_a", raise_request_exception=False)
    response = client.post(f"/api/v1/jobs/{world.job.pk}/metrics/",
                           {"samples": [{"step": 1, "generation": generation}]}, content_type="application/json")
    assert response.status_code == 400 and "samples[0].generation" in response.json()["errors"]


def test_metrics_instance_out_of_range_is_a_400(db):
    world = make_world()
    client = world.api_client("admin_a", raise_request_exception=False)
    response = client.post(f"/api/v1/jobs/{world.job.pk}/metrics/",
                           {"samples": [{"step": 1, "instance": 2**64}]}, content_type="application/json")
    assert response.status_code == 400 and "samples[0].instance" in response.json()["errors"]


ID_FILTER_URLS = [
    "/api/v1/tokens/?team={n}", "/api/v1/jobs/?team={n}", "/api/v1/instances/?team={n}",
    "/api/v1/instances/?job={n}", "/api/v1/notices/?instance={n}", "/api/v1/billing/segments/?job={n}",
    "/api/v1/billing/segments/?instance={n}", "/api/v1/jobs/{job}/metrics/?instance={n}",
]


@pytest.mark.parametrize("url", ID_FILTER_URLS)
def test_id_filters_out_of_range_are_a_400_naming_the_parameter(db, url):
    world = make_world()
    client = world.api_client("admin_a", raise_request_exception=False)
    response = client.get(url.format(n=2**70, job=world.job.pk))
    assert response.status_code == 400
    assert url.rsplit("?", 1)[1].split("=")[0] in response.json()["errors"]
