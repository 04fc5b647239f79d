"""`POST /api/v1/notices/{id}/retry/` (issue 21, "API completeness"): a team admin gives a failed
notice another round; it is handed to the workers and processed like a new one. Only a failed
notice (409 otherwise), another team 404, a member 403."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.fleet.models import InterruptionNotice, NoticeStatus
from controlplane.fleet.notices import claims
from controlplane.orchestration.notices import notices_drain
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db


def _notice(world, status=NoticeStatus.FAILED, n=1):
    return InterruptionNotice.objects.create(
        team=world.team, source="aws_eventbridge", kind="interruption", action="terminate",
        dedup_key=f"retry-{world.team.slug}-{n}", provider_instance_id=world.instance.provider_instance_id,
        instance=world.instance, received_at=timezone.now(), status=status, attempts=5, error="boom",
    )


@pytest.fixture
def worlds():
    return make_team_world("alpha"), make_team_world("beta")


def test_an_admin_retries_a_failed_notice_and_a_worker_processes_it(worlds, monkeypatch,
                                                                     django_capture_on_commit_callbacks):
    alpha, _ = worlds
    notice = _notice(alpha)
    handed: list[list[int]] = []
    monkeypatch.setattr(claims, "notices_handoff", lambda *, notice_ids: handed.append(notice_ids))
    with django_capture_on_commit_callbacks(execute=True):
        response = alpha.admin_client.post(f"/api/v1/notices/{notice.pk}/retry/")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "received" and response.json()["attempts"] == 0
    assert handed == [[notice.pk]]
    # The workers' own path picks it up as a new notice.
    assert notices_drain().processed == 1
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.PROCESSED and notice.attempts == 1


@pytest.mark.parametrize("status", [NoticeStatus.RECEIVED, NoticeStatus.ENQUEUED, NoticeStatus.PROCESSED])
def test_only_a_failed_notice_is_retried(worlds, status):
    alpha, _ = worlds
    notice = _notice(alpha, status=status)
    response = alpha.admin_client.post(f"/api/v1/notices/{notice.pk}/retry/")
    assert response.status_code == 409 and "status" in response.json()["errors"]
    notice.refresh_from_db()
    assert notice.status == status and notice.attempts == 5


def test_members_agents_and_other_teams_cannot(worlds):
    alpha, beta = worlds
    notice = _notice(alpha)
    url = f"/api/v1/notices/{notice.pk}/retry/"
    assert alpha.member_client.post(url).status_code == 403
    assert alpha.agent_client.post(url).status_code == 403
    assert beta.admin_client.post(url).status_code == 404
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.FAILED and notice.attempts == 5
