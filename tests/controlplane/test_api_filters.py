"""The API lists' query filters are django-filter FilterSets (controlplane/common/filters.py):
values they cannot take answer 400 naming the parameter, the id filters only narrow what the team
scoping already allows, and every filter is documented in the OpenAPI schema with its bounds."""

from __future__ import annotations

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from controlplane.accounts.models import ApiToken
from controlplane.jobs.models import JobStatus
from controlplane.market.models import InstanceType
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_instance_type, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return make_team_world()


@pytest.mark.parametrize(("url", "param"), [
    ("/api/v1/jobs/?team=1.5", "team"),  # an integer, not a decimal rounded down
    ("/api/v1/jobs/?team=0", "team"),
    ("/api/v1/jobs/?ordering=name,config", "ordering"),
    ("/api/v1/jobs/?search=" + "x" * 101, "search"),
    ("/api/v1/jobs/{job}/metrics/?since_step=-1", "since_step"),
    ("/api/v1/jobs/{job}/events/?since=yesterday", "since"),
    ("/api/v1/instances/?zone=" + "z" * 41, "zone"),
    ("/api/v1/alert-endpoints/?active=perhaps", "active"),
    ("/api/v1/webhook-credentials/?active=2", "active"),
    ("/api/v1/instance-types/?accelerated=maybe", "accelerated"),
    ("/api/v1/zones/?region=" + "r" * 41, "region"),
])
def test_bad_values_answer_400_naming_the_parameter(world, url, param):
    response = world.member_client.get(url.format(job=world.job.pk))
    assert response.status_code == 400, response.content
    body = response.json()
    assert list(body["errors"]) == [param] and body["detail"]


def test_several_ordering_keys_then_the_id(world):
    make_job(world.team, name="b", status=JobStatus.RUNNING)
    make_job(world.team, name="a", status=JobStatus.RUNNING)
    make_job(world.team, name="c", status=JobStatus.FAILED)
    rows = world.member_client.get("/api/v1/jobs/?ordering=-status,name").json()["results"]
    assert [(r["status"], r["name"]) for r in rows if r["name"] in {"a", "b", "c"}] == [
        ("running", "a"), ("running", "b"), ("failed", "c")]


def test_an_empty_value_filters_nothing(world):
    everything = world.member_client.get("/api/v1/jobs/").json()["count"]
    assert world.member_client.get("/api/v1/jobs/?status=&team=&ordering=").json()["count"] == everything == 1


def test_boolean_spellings(world):
    make_instance_type("p4d.24xlarge")
    InstanceType.objects.filter(pk=make_instance_type("c5.large").pk).update(accelerator_count=0)

    def names(query: str) -> set[str]:
        response = world.member_client.get(f"/api/v1/instance-types/?{query}")
        assert response.status_code == 200, response.content
        return {row["name"] for row in response.json()["results"]}

    assert "p4d.24xlarge" in names("accelerated=true") and "c5.large" not in names("accelerated=true")
    assert names("accelerated=1") == names("accelerated=True") == names("accelerated=true")
    assert "c5.large" in names("accelerated=no") and "p4d.24xlarge" not in names("accelerated=false")


def test_another_teams_id_in_a_filter_finds_nothing(world):
    other = make_team_world()
    assert world.member_client.get(f"/api/v1/jobs/?team={other.team.pk}").json()["count"] == 0
    assert world.member_client.get(f"/api/v1/instances/?job={other.job.pk}").json()["count"] == 0
    assert world.admin_client.get(f"/api/v1/tokens/?team={other.team.pk}").json()["count"] == 0


def test_active_tokens(world):
    token = ApiToken.objects.filter(team=world.team, user=world.member).get()
    token.expires_at = timezone.now() - timezone.timedelta(days=1)
    token.save(update_fields=["expires_at"])
    active = {r["id"] for r in world.admin_client.get("/api/v1/tokens/?active=true").json()["results"]}
    inactive = {r["id"] for r in world.admin_client.get("/api/v1/tokens/?active=false").json()["results"]}
    assert token.pk in inactive and token.pk not in active and active


def test_filters_are_in_the_schema_with_their_bounds():
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]

    def params(path: str) -> dict[str, dict]:
        return {p["name"]: p["schema"] for p in paths[path]["get"]["parameters"] if p["in"] == "query"}

    jobs = params("/api/v1/jobs/")
    assert jobs["team"] == {"type": "integer", "minimum": 1, "maximum": 2**63 - 1, "format": "int64"}
    assert jobs["search"]["maxLength"] == 100
    assert "-deadline" in jobs["ordering"]["items"]["enum"]
    assert set(params("/api/v1/jobs/{id}/metrics/")) >= {"since_step", "until_step", "generation", "instance"}
    assert params("/api/v1/jobs/{id}/events/")["since"]["format"] == "date-time"
    assert params("/api/v1/instances/")["zone"]["maxLength"] == 40
    assert params("/api/v1/notices/")["unknown_instance"]["type"] == "boolean"
    assert params("/api/v1/webhook-credentials/")["active"]["type"] == "boolean"
    assert set(params("/api/v1/billing/segments/")) >= {"job", "instance"}
    assert params("/api/v1/instance-types/")["accelerated"]["type"] == "boolean"
    assert set(params("/api/v1/zones/")) >= {"cloud", "region"}
    # A detail route is not filtered by its list's parameters.
    assert "status" not in params("/api/v1/jobs/{id}/")


@pytest.mark.parametrize(("since", "found"), [
    ("1047-06-12T08:07:46-17:47", True),  # an offset PostgreSQL refuses (beyond +-15:59): compared in UTC
    ("9999-12-31T23:00:00-17:00", False),  # past the calendar's end in UTC: nothing is that late
    ("0001-01-01T00:00:00+17:00", True),  # before the calendar's start in UTC: everything is later
    ("2000-01-01T00:00:00+02:00", True),
])
def test_an_events_since_with_any_offset_python_reads_is_compared_in_utc(world, since, found):
    from urllib.parse import quote

    response = world.member_client.get(f"/api/v1/jobs/{world.job.pk}/events/?since={quote(since)}")
    assert response.status_code == 200, response.content
    assert (response.json()["count"] > 0) == found
