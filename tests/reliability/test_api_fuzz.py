"""Schemathesis against /api/v1/schema/, in process (WSGI), as an authenticated admin of team A.

Checks on every generated request: no 5xx (`not_a_server_error`) and the response conforms to the
documented schema for its status (`response_schema_conformance`). Half of the cases that carry a
path id are pointed at team A's real objects, so the generated inputs reach the views' logic rather
than stopping at a 404.

Size: SPOTPIPE_FUZZ_EXAMPLES examples per operation (default 25: >= 500 requests over the API's
operations, the issue's bar); SPOTPIPE_FUZZ_QUICK=1 runs 5 per operation (CI's quick set).
Derandomized, so a failure reproduces with the same command.
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

QUICK = os.environ.get("SPOTPIPE_FUZZ_QUICK", "") not in {"", "0"}
EXAMPLES = int(os.environ.get("SPOTPIPE_FUZZ_EXAMPLES", "5" if QUICK else "25"))
MIN_REQUESTS = 500 if not QUICK and EXAMPLES >= 25 else 0

schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", application)

SENT: list[str] = []  # "METHOD path -> status" of every request, for the total below
SERVER_ERRORS: list[str] = []


@pytest.fixture
def fuzz_world(db):
    return make_world()


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
    assert len(SENT) >= MIN_REQUESTS, f"only {len(SENT)} generated requests, the bar is {MIN_REQUESTS}"
    assert not SERVER_ERRORS, SERVER_ERRORS
