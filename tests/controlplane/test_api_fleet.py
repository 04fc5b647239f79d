"""Fleet API: instance and notice lists with validated filters, instance events, and the agent
heartbeat."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.fleet.services import instance_transition
from tests.controlplane.api_helpers import make_api_token, make_team_world, token_client
from tests.controlplane.factories import make_instance, make_instance_type, make_job, make_zone

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return make_team_world()


def test_instance_filters(world):
    other_job = make_job(world.team)
    big = make_instance(world.team, job=other_job, instance_type=make_instance_type("p4d.24xlarge"),
                        zone=make_zone("us-west-2b", "usw2-az2"), lifecycle="on_demand")
    instance_transition(instance=big, to="running")
    client = world.member_client

    def ids(query: str) -> set[int]:
        response = client.get(f"/api/v1/instances/?{query}")
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    assert ids("") == {world.instance.pk, big.pk}
    assert ids("state=running") == {big.pk}
    assert ids(f"job={world.job.pk}") == {world.instance.pk}
    assert ids("instance_type=p4d.24xlarge") == {big.pk}
    assert ids("zone=us-west-2b") == ids("zone=usw2-az2") == {big.pk}
    assert ids("lifecycle=spot") == {world.instance.pk}
    assert ids("provider=local") == {world.instance.pk, big.pk}
    assert ids("provider=aws") == set()
    assert ids(f"search={big.provider_instance_id[-6:]}") == {big.pk}
    events = client.get(f"/api/v1/instances/{big.pk}/events/").json()["results"]
    assert [(e["from_state"], e["to_state"]) for e in events] == [("requested", "running")]


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("/api/v1/instances/?state=bogus", "state"),
        ("/api/v1/instances/?provider=gcp", "provider"),
        ("/api/v1/instances/?job=first", "job"),
        ("/api/v1/instances/?ordering=key_hash", "ordering"),
        ("/api/v1/notices/?status=lost", "status"),
        ("/api/v1/notices/?source=email", "source"),
        ("/api/v1/notices/?kind=meteor", "kind"),
        ("/api/v1/notices/?unknown_instance=perhaps", "unknown_instance"),
        ("/api/v1/tokens/?kind=robot", "kind"),
        ("/api/v1/tokens/?active=sometimes", "active"),
    ],
)
def test_bad_filter_values_answer_400_naming_the_parameter(world, url, param):
    response = world.admin_client.get(url)
    assert response.status_code == 400, response.content
    assert param in response.json()["errors"] and param in response.json()["detail"]


def test_notice_filters(world):
    now = timezone.now()

    def notice(key: str, **fields) -> InterruptionNotice:
        base = {"team": world.team, "source": "aws_eventbridge", "kind": "interruption", "dedup_key": key,
                "provider_instance_id": "i-x", "received_at": now}
        return InterruptionNotice.objects.create(**{**base, **fields})

    known = notice("a", instance=world.instance, status="processed")
    unknown = notice("b", unknown_instance=True, source="aws_sns", kind="rebalance")
    client = world.member_client

    def ids(query: str) -> set[int]:
        return {row["id"] for row in client.get(f"/api/v1/notices/?{query}").json()["results"]}

    assert ids("") == {known.pk, unknown.pk}
    assert ids("unknown_instance=true") == {unknown.pk}
    assert ids("unknown_instance=false") == {known.pk}
    assert ids("status=processed") == {known.pk}
    assert ids("source=aws_sns") == ids("kind=rebalance") == {unknown.pk}
    assert ids(f"instance={world.instance.pk}") == {known.pk}
    # Notices are read-only here: the webhooks receive them.
    assert client.post("/api/v1/notices/", {}, format="json").status_code == 405
    assert client.delete(f"/api/v1/notices/{known.pk}/").status_code == 405


def test_heartbeat_updates_the_agents_instance(world):
    url = f"/api/v1/instances/{world.instance.pk}/heartbeat/"
    before = timezone.now()
    response = world.agent_client.post(url, {"agent_address": "10.0.0.5:7070"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["instance"] == world.instance.pk and body["job"] == world.job.pk
    assert body["current_generation"] == 0 and body["state"] == "requested"
    world.instance.refresh_from_db()
    assert world.instance.last_heartbeat_at >= before
    assert world.instance.agent_address == "10.0.0.5:7070"
    # An empty body is fine; the stamp moves forward.
    first = world.instance.last_heartbeat_at
    assert world.agent_client.post(url).status_code == 200
    world.instance.refresh_from_db()
    assert world.instance.last_heartbeat_at >= first and world.instance.agent_address == "10.0.0.5:7070"


def test_heartbeat_is_for_the_instances_own_agent_only(world):
    url = f"/api/v1/instances/{world.instance.pk}/heartbeat/"
    # Users of the team cannot pretend a node is alive.
    assert world.admin_client.post(url).status_code == 403
    # Another instance's agent (same team) does not even see this instance.
    sibling = make_instance(world.team, job=world.job)
    sibling_agent = token_client(make_api_token(world.team, instance=sibling))
    assert sibling_agent.post(url).status_code == 404
    world.instance.refresh_from_db()
    assert world.instance.last_heartbeat_at is None


def test_heartbeat_of_an_ended_instance_is_refused(world):
    """The instance's end revokes its agent token: 401 (the agent stops). The view's own 409 is
    left for a heartbeat authenticated just before the instance ended."""
    instance_transition(instance=world.instance, to="terminated")
    response = world.agent_client.post(f"/api/v1/instances/{world.instance.pk}/heartbeat/")
    assert response.status_code == 401
    assert Instance.objects.get(pk=world.instance.pk).last_heartbeat_at is None


@pytest.mark.parametrize("body", [{"agent_address": "x" * 201}, {"agent_address": ["10.0.0.5"]}])
def test_heartbeat_bad_input_names_the_field_and_stamps_nothing(world, body):
    response = world.agent_client.post(f"/api/v1/instances/{world.instance.pk}/heartbeat/", body, format="json")
    assert response.status_code == 400 and "agent_address" in response.json()["errors"]
    assert Instance.objects.get(pk=world.instance.pk).last_heartbeat_at is None
