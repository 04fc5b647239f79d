"""Schemathesis with every check it has, against /api/v1/schema/ (webhook intake included), in
process (WSGI), as an authenticated admin of team A, on whichever database the run uses.

Checks: all of schemathesis's registered checks (`ALL_CHECKS`): no 5xx, status codes, content types,
headers and bodies as documented, schema-invalid requests refused, schema-valid ones accepted,
missing required headers refused, undocumented methods answered 405 with `Allow`, credentials
enforced, and the stateful ones (use-after-free, resource availability, object-level
authorization), which need a recorded sequence and so find nothing to compare in one-request cases.

What the schema cannot state, the fuzz supplies in the cases it generates as valid (and only
there, so invalid cases stay invalid): ids of objects that exist (team A's team, job, instance,
user; half the cases with a path id still get a random one, so 404s are exercised too), times
that must be in the future, an alert URL whose host is public, the team's webhook credentials
(EventBridge API key, Pub/Sub token, Standard Webhooks signatures computed over the bytes sent).
`POSITIVE_ACCEPTANCE_EXEMPT` names the operations whose valid bodies depend on rules OpenAPI 3.0
cannot express; there, and only there, `positive_data_acceptance` is left out, each with its
reason. Every other check runs on them.

Size: 5 examples per operation by default (what `make test` runs); SPOTPIPE_FUZZ_EXAMPLES=N
overrides it. Derandomized, so a failure reproduces with the same command. The volume test at the
end requires >= 1,000 requests.

The server errors it found (out-of-range integers reaching the database) are fixed; the tests at
the end pin each exact request to its 400 / non-5xx answer.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import timedelta

import pytest
import schemathesis
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.specs.openapi.checks import positive_data_acceptance

from controlplane.webhooks import signing
from controlplane.webhooks.credentials import credential_create
from controlplane.wsgi import application
from tests.reliability.world import make_world

EXAMPLES = int(os.environ.get("SPOTPIPE_FUZZ_EXAMPLES", "5"))
MIN_REQUESTS = 1000  # the bar

load_all_checks()
ALL_CHECKS = [CHECKS.get_one(name) for name in CHECKS.get_all_names()]

# "METHOD path" -> why a schema-valid request may still be refused there (a 400 naming the rule).
POSITIVE_ACCEPTANCE_EXEMPT: dict[str, str] = {
    "POST /api/v1/webhooks/gcp/{team_slug}/":
        "message.data is base64 of a JSON audit-log entry: OpenAPI 3.0 cannot state a schema inside base64",
    "POST /api/v1/webhooks/azure/{team_slug}/":
        "needs one Preempt/Terminate event among any others (`contains`, not in OpenAPI 3.0)",
    "POST /api/v1/packages/":
        "the uploaded file's name must be a wheel or sdist name: a multipart file name has no schema",
    "POST /api/v1/jobs/":
        "the job contract (config or model_spec, the model's sizes, a deadline or a budget) is checked by "
        "job_submit against the runtime's JobConfig (docs/api.md); not yet a schema component",
    "POST /api/v1/plans/":
        "model sizes must divide (n_embd by n_head), instance types need a profile, and model/global_batch/"
        "samples are required together when no job is given; not yet stated as oneOf variants",
    "POST /api/v1/webhook-credentials/":
        "which scheme fits which source, and fields only one scheme takes (oidc, topic_arn, username); "
        "not yet stated as oneOf variants per source and scheme",
    "POST /api/v1/tokens/":
        "an instance binds only an agent token (kind=agent); not yet stated as oneOf variants per kind",
}

schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", application)
# The API refuses a NUL anywhere in its input with a 400 (PostgreSQL cannot store one:
# common/json_input.py; test_job_contract.py and test_webhooks_hostile_bodies.py send NULs).
# OpenAPI 3.0 can say so for string values but not for object keys, so the fuzz generates none.
schema.config.generation.update(allow_x00=False)
# test_fuzz_volume counts what the module's fuzz cases sent: one process, in file order.
# Not on the xdist workers: even with `--dist loadfile` the volume test counted 38 requests there.
pytestmark = pytest.mark.serial

SENT: list[str] = []  # "METHOD path -> status" of every request, for the total below
SERVER_ERRORS: list[str] = []


class FuzzWorld:
    """Team A's world plus the webhook credentials the fuzz signs with (secrets in clear)."""

    def __init__(self) -> None:
        self.world = make_world()
        team = self.world.team_a
        _, self.eventbridge_key = credential_create(team=team, source="aws_eventbridge", scheme="api_key",
                                                    name="fuzz-eventbridge")
        _, self.gcp_token = credential_create(team=team, source="gcp", scheme="token", name="fuzz-gcp")
        _, self.generic_secret = credential_create(team=team, source="generic", scheme="standard_webhooks",
                                                   name="fuzz-generic")
        _, self.azure_secret = credential_create(team=team, source="azure", scheme="standard_webhooks",
                                                 name="fuzz-azure")
        self.instance_type = self.world.instance.instance_type.name
        self.zone = self.world.instance.zone.code


@pytest.fixture
def fuzz_world(db):
    """Requests run inside the test's transaction. Django's test client keeps
    `close_old_connections` off the request signals for that reason; schemathesis calls the WSGI app
    directly, so do the same (else PostgreSQL's connection, and the transaction, is closed after
    the first request)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield FuzzWorld()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _real_ids(world) -> dict[str, object]:
    """Path prefix -> an id of team A's object there."""
    return {
        "/api/v1/teams/": world.team_a.pk, "/api/v1/tokens/": world.member_a_token.pk,
        "/api/v1/instances/": world.instance.pk, "/api/v1/notices/": world.notice.pk,
        "/api/v1/jobs/": world.job.pk, "/api/v1/alert-endpoints/": world.alert_endpoint.pk,
        "/api/v1/webhook-credentials/": world.credential.pk, "/api/v1/packages/": world.package.sha256,
    }


def _supply_what_the_schema_cannot_state(case, fw: FuzzWorld) -> None:
    """Valid cases only: the values whose validity is a fact of the database or the clock."""
    world = fw.world
    if case.path.startswith("/api/v1/webhooks/"):
        case.path_parameters["team_slug"] = world.team_a.slug
    elif case.path_parameters and len(SENT) % 2 == 0:
        for prefix, pk in _real_ids(world).items():
            if case.path.startswith(prefix):
                for name in case.path_parameters:
                    if name != "user_id":
                        case.path_parameters[name] = pk
                if "user_id" in case.path_parameters:
                    case.path_parameters["user_id"] = world.member_a.pk
    body = case.body if isinstance(case.body, dict) else {}
    future = (timezone.now() + timedelta(days=7)).isoformat()
    for name, value in {"team": world.team_a.pk, "instance": world.instance.pk, "job": world.job.pk,
                        "username": world.member_b.username}.items():
        if name in body and not case.path.startswith("/api/v1/webhooks/"):
            body[name] = value
    for name in ("expires_at", "deadline"):
        if body.get(name) is not None and not case.path.startswith("/api/v1/webhooks/"):
            body[name] = future
    if "url" in body:
        body["url"] = f"https://hooks.example.com/fuzz-{uuid.uuid4().hex[:8]}"
    samples = body.get("samples") if isinstance(body.get("samples"), list) else []
    for sample in samples:
        if isinstance(sample, dict) and sample.get("instance") is not None:
            sample["instance"] = world.instance.pk
    query = case.query if isinstance(case.query, dict) else {}
    if "instance_type" in query and case.path.startswith("/api/v1/spot-prices/"):
        query["instance_type"] = fw.instance_type
    if "zone" in query and case.path.startswith("/api/v1/spot-prices/"):
        query["zone"] = fw.zone
    if "start" in query:  # an order between two parameters: end after start, within 366 days
        start = parse_date(str(query["start"])) or parse_datetime(str(query["start"]))
        if start is not None:
            query["end"] = (start + timedelta(days=1)).isoformat()


def _webhook_credentials(case, fw: FuzzWorld) -> tuple[dict[str, str], dict]:
    """Headers (and a body sent as exact bytes, for a signature) of team A's webhook credentials."""
    path = case.path
    if "/webhooks/aws/eventbridge/" in path:
        return {"x-api-key": fw.eventbridge_key}, {}
    if "/webhooks/gcp/" in path:
        return {"X-Spotpipe-Token": fw.gcp_token}, {}
    secret = fw.generic_secret if "/webhooks/notice/" in path else fw.azure_secret if "/webhooks/azure/" in path else ""
    if not secret or not isinstance(case.body, dict | list):
        return {}, {}
    raw = json.dumps(case.body).encode()
    headers = signing.signed_headers(secret=secret, msg_id=f"fuzz-{uuid.uuid4().hex}", body=raw)
    return {**headers, "Content-Type": "application/json"}, {"data": raw}


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_api_fuzz(case, fuzz_world):
    send_and_check(case, fuzz_world)


def send_and_check(case, fw: FuzzWorld):
    positive = case.meta is None or case.meta.generation.mode == GenerationMode.POSITIVE
    if positive:
        _supply_what_the_schema_cannot_state(case, fw)
    headers = {"Authorization": f"Token {fw.world.keys['admin_a']}"}
    extra_headers, body = _webhook_credentials(case, fw) if positive else ({}, {})
    headers.update(extra_headers)
    label = f"{case.method} {case.path}"
    excluded = [positive_data_acceptance] if label in POSITIVE_ACCEPTANCE_EXEMPT else []
    try:
        response = case.call_and_validate(headers=headers, checks=ALL_CHECKS, excluded_checks=excluded, **body)
    finally:
        SENT.append(label)
    if response.status_code >= 500:
        SERVER_ERRORS.append(f"{label} body={case.body!r} query={case.query!r}")
    return response


def test_fuzz_volume():
    """Runs after the fuzz cases (same module, file order): the run sent enough requests and no
    server error slipped through."""
    print(f"\nschemathesis: {len(SENT)} requests, {len(ALL_CHECKS)} checks on each")
    assert len(SENT) >= MIN_REQUESTS, f"only {len(SENT)} generated requests, the bar is {MIN_REQUESTS}"
    assert not SERVER_ERRORS, SERVER_ERRORS


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


def test_webhook_time_that_cannot_exist_is_a_400(db, client):
    """A well-formed time that names no instant (month 13) was a ValueError out of Django's parser."""
    world = make_world()
    _, key = credential_create(team=world.team_a, source="aws_eventbridge", scheme="api_key", name="bad-time")
    event = {"id": "ev-bad-time", "detail-type": "EC2 Instance Rebalance Recommendation",
             "time": "2026-13-01T00:00:00Z", "detail": {"instance-id": "i-1"}}
    response = client.post(f"/api/v1/webhooks/aws/eventbridge/{world.team_a.slug}/", event,
                           content_type="application/json", HTTP_X_API_KEY=key)
    assert response.status_code == 400 and "time" in response.json()["errors"]
