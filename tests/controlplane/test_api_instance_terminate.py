"""`POST /api/v1/instances/{id}/terminate/` (issue 21, "API completeness"): a team admin ends a node;
the provider is asked, the row is terminated, billing closes, the agent token dies, an active job
reacts; another team 404, a member 403, an ended instance 409, a refusing provider 502 and nothing
written."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.billing.models import BillingSegment, PriceSource
from controlplane.fleet.models import Instance
from controlplane.jobs.models import JobEvent, JobStatus
from controlplane.orchestration.services import liveness as orchestration  # instance_terminate's get_provider
from tests.controlplane.api_helpers import make_team_world
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(monkeypatch):
    fake = FakeProvider()
    monkeypatch.setattr(orchestration, "get_provider", lambda kind: fake)
    return fake


@pytest.fixture
def worlds():
    alpha, beta = make_team_world("alpha"), make_team_world("beta")
    for world in (alpha, beta):
        world.instance.state = "running"
        world.instance.running_at = timezone.now() - timedelta(hours=1)
        world.instance.save(update_fields=["state", "running_at"])
        BillingSegment.objects.create(instance=world.instance, team=world.team, job=world.job,
                                      start=world.instance.running_at, price_per_hour=1,
                                      price_source=PriceSource.SPOT)
    return alpha, beta


def test_an_admin_terminates_a_node(worlds, provider):
    alpha, _ = worlds
    url = f"/api/v1/instances/{alpha.instance.pk}/terminate/"
    response = alpha.admin_client.post(url, {"reason": "stuck GPU"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "terminated"
    assert provider.terminated == [alpha.instance.provider_instance_id]
    instance = Instance.objects.get(pk=alpha.instance.pk)
    assert instance.state == "terminated" and instance.ended_at is not None
    assert BillingSegment.objects.get(instance=instance).end == instance.ended_at
    assert alpha.agent_client.post(f"/api/v1/instances/{instance.pk}/heartbeat/", {}, format="json"
                                   ).status_code == 401  # its agent token was revoked
    again = alpha.admin_client.post(url, {}, format="json")
    assert again.status_code == 409 and "state" in again.json()["errors"]
    assert provider.terminated == [alpha.instance.provider_instance_id]  # not asked twice


def test_an_active_job_hears_of_it(worlds, provider):
    alpha, _ = worlds
    alpha.job.status = JobStatus.RUNNING
    alpha.job.save(update_fields=["status"])
    assert alpha.admin_client.post(f"/api/v1/instances/{alpha.instance.pk}/terminate/").status_code == 200
    assert JobEvent.objects.filter(job=alpha.job, kind="instance_terminated").exists()


def test_members_agents_and_other_teams_cannot(worlds, provider):
    alpha, beta = worlds
    url = f"/api/v1/instances/{alpha.instance.pk}/terminate/"
    assert alpha.member_client.post(url).status_code == 403
    assert alpha.agent_client.post(url).status_code == 403
    assert beta.admin_client.post(url).status_code == 404
    assert Instance.objects.get(pk=alpha.instance.pk).state == "running" and provider.terminated == []


def test_a_refusing_provider_is_502_and_nothing_changes(worlds, monkeypatch):
    alpha, _ = worlds
    monkeypatch.setattr(orchestration, "get_provider", lambda kind: FakeProvider(refuse_terminate=True))
    response = alpha.admin_client.post(f"/api/v1/instances/{alpha.instance.pk}/terminate/")
    assert response.status_code == 502
    assert Instance.objects.get(pk=alpha.instance.pk).state == "running"
    assert BillingSegment.objects.get(instance=alpha.instance).end is None


@pytest.mark.parametrize("body", [{"reason": "x" * 201}, {"reason": "nul\x00"}, {"reason": ["list"]}])
def test_bad_reason_is_400_naming_it(worlds, provider, body):
    alpha, _ = worlds
    response = alpha.admin_client.post(f"/api/v1/instances/{alpha.instance.pk}/terminate/", body, format="json")
    assert response.status_code == 400 and "reason" in response.json()["errors"]
    assert Instance.objects.get(pk=alpha.instance.pk).state == "running" and provider.terminated == []


class _SlowToTerminate(FakeProvider):
    """A provider during whose terminate call the node's heartbeats stop being fresh and the periodic
    checks run (the dead-node check, the provider reporting the node gone): the race of issue 39."""

    def terminate(self, ids):
        from controlplane.orchestration.services.liveness import instances_detect_dead, instances_mark_lost

        super().terminate(ids)
        Instance.objects.filter(provider_instance_id__in=ids).update(
            last_heartbeat_at=timezone.now() - timedelta(minutes=5))
        instances_detect_dead(timeout_s=1.0)
        instances_mark_lost(instances=list(Instance.objects.filter(provider_instance_id__in=ids)),
                            reason="provider reports it gone")


def test_a_terminate_is_not_taken_for_a_preemption_while_the_provider_ends_the_node(worlds, monkeypatch):
    alpha, _ = worlds
    slow = _SlowToTerminate()
    monkeypatch.setattr(orchestration, "get_provider", lambda kind: slow)
    alpha.job.status = JobStatus.RUNNING
    alpha.job.save(update_fields=["status"])

    response = alpha.admin_client.post(f"/api/v1/instances/{alpha.instance.pk}/terminate/", {"reason": "drain"},
                                       format="json")

    assert response.status_code == 200, response.content
    instance = Instance.objects.get(pk=alpha.instance.pk)
    assert instance.state == "terminated"
    kinds = list(JobEvent.objects.filter(job=alpha.job).values_list("kind", flat=True))
    assert "instance_terminated" in kinds and "instance_lost" not in kinds
    (event,) = instance.events.filter(to_state="terminated")
    assert event.detail["reason"] == "drain"
