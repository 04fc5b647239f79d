"""No N+1: every list endpoint makes the same number of queries for 1 object as for 20."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.accounts.models import Membership
from controlplane.fleet.models import InstanceEvent, InterruptionNotice
from controlplane.jobs.models import JobEvent, JobGeneration, MetricSample, Reconfiguration
from tests.controlplane.api_helpers import TeamWorld, make_api_token, make_api_user, make_team_world
from tests.controlplane.factories import make_instance, make_instance_type, make_job, make_team, make_zone

pytestmark = pytest.mark.django_db


def _add_teams(w: TeamWorld, i: int) -> None:
    team = make_team()
    Membership.objects.create(team=team, user=w.admin, role="member")
    make_api_user(team)


def _add_tokens(w: TeamWorld, i: int) -> None:
    make_api_token(w.team, user=make_api_user(w.team))
    make_api_token(w.team, instance=make_instance(w.team))


def _add_jobs(w: TeamWorld, i: int) -> None:
    job = make_job(w.team, created_by=make_api_user(w.team))
    make_instance(w.team, job=job)


def _add_instances(w: TeamWorld, i: int) -> None:
    # Distinct types, zones and jobs, so a missing select_related would show.
    make_instance(w.team, job=make_job(w.team), instance_type=make_instance_type(f"t{i}.large"),
                  zone=make_zone(f"eu-west-{i}a", f"euw{i}-az1"))


def _add_generation(w: TeamWorld, i: int) -> None:
    JobGeneration.objects.create(job=w.job, number=i + 1, membership=[{"instance": 1, "rank": 0}], layout={},
                                 created_at=timezone.now())


def _add_reconfiguration(w: TeamWorld, i: int) -> None:
    instance = make_instance(w.team, job=w.job)
    notice = InterruptionNotice.objects.create(
        team=w.team, source="aws_sns", kind="interruption", dedup_key=f"n{i}-{w.job.pk}",
        provider_instance_id=instance.provider_instance_id, instance=instance, received_at=timezone.now())
    Reconfiguration.objects.create(job=w.job, trigger="notice", trigger_key=f"r{i}", strategy="recycle",
                                   instance=instance, notice=notice, decided_at=timezone.now())


def _add_event(w: TeamWorld, i: int) -> None:
    JobEvent.objects.create(job=w.job, kind="x", message=str(i), at=timezone.now())


def _add_metric(w: TeamWorld, i: int) -> None:
    MetricSample.objects.create(job=w.job, step=i, at=timezone.now(), loss=1.0,
                                instance=make_instance(w.team, job=w.job))


def _add_instance_event(w: TeamWorld, i: int) -> None:
    InstanceEvent.objects.create(instance=w.instance, kind="state", at=timezone.now())


def _add_notice(w: TeamWorld, i: int) -> None:
    instance = make_instance(w.team)
    InterruptionNotice.objects.create(
        team=w.team, source="aws_eventbridge", kind="interruption", dedup_key=f"q{i}-{w.team.pk}",
        provider_instance_id=instance.provider_instance_id, instance=instance, received_at=timezone.now())


CASES: list[tuple[str, Callable[[TeamWorld, int], None], str]] = [
    ("/api/v1/teams/", _add_teams, "session"),
    ("/api/v1/tokens/", _add_tokens, "admin"),
    ("/api/v1/jobs/", _add_jobs, "member"),
    ("/api/v1/jobs/{job}/generations/", _add_generation, "agent"),
    ("/api/v1/jobs/{job}/reconfigurations/", _add_reconfiguration, "member"),
    ("/api/v1/jobs/{job}/events/", _add_event, "member"),
    ("/api/v1/jobs/{job}/metrics/", _add_metric, "agent"),
    ("/api/v1/instances/", _add_instances, "member"),
    ("/api/v1/instances/{instance}/events/", _add_instance_event, "member"),
    ("/api/v1/notices/", _add_notice, "member"),
]


@pytest.mark.parametrize(("path", "add", "who"), CASES, ids=[c[0] for c in CASES])
def test_list_query_count_does_not_grow_with_rows(path, add, who):
    world = make_team_world()
    if who == "session":
        client = type(world.admin_client)()
        client.force_login(world.admin)
    else:
        client = getattr(world, f"{who}_client")
    url = path.format(job=world.job.pk, instance=world.instance.pk)
    add(world, 0)
    client.get(url)  # warm-up: the token's last_used_at is touched at most once a minute

    def count() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, response.content
        return len(queries), response.json()["count"]

    small, rows_small = count()
    for i in range(1, 20):
        add(world, i)
    large, rows_large = count()
    assert rows_large >= rows_small + 19
    assert small == large, f"{url}: {small} queries for {rows_small} rows, {large} for {rows_large}"
