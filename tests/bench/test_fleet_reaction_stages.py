"""The fleet bench splits an agent notice's reaction at its stored row's stamps: stored, claimed by
a drain, locked for processing, and the job's next generation. The spans cover the reaction with
no gap, each is its own stamp minus the one before, and a notice not yet processed has none."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from bench.fleet import REACTION_STAGES, _reaction_stages
from controlplane.fleet.models import InterruptionNotice, NoticeSource, NoticeStatus
from tests.controlplane.factories import make_instance, make_team

pytestmark = pytest.mark.django_db


def _notice(instance, **stamps) -> InterruptionNotice:
    return InterruptionNotice.objects.create(
        team=instance.team, instance=instance, source=NoticeSource.AGENT, kind="interruption",
        dedup_key=f"agent:test:{instance.pk}", provider_instance_id=instance.provider_instance_id, **stamps)


def test_the_spans_run_from_the_post_to_the_generation_without_a_gap() -> None:
    instance = make_instance(make_team())
    sent = timezone.now()
    _notice(instance, received_at=sent + timedelta(milliseconds=20), enqueued_at=sent + timedelta(milliseconds=270),
            processed_at=sent + timedelta(milliseconds=300), status=NoticeStatus.PROCESSED)
    spans = _reaction_stages({"instance": instance.pk, "sent_wall": sent.timestamp()}, published=0.45)
    assert list(spans) == list(REACTION_STAGES)
    assert spans["posted_to_stored"] == pytest.approx(0.020, abs=1e-6)
    assert spans["stored_to_claimed"] == pytest.approx(0.250, abs=1e-6)
    assert spans["claimed_to_locked"] == pytest.approx(0.030, abs=1e-6)
    assert spans["locked_to_published"] == pytest.approx(0.150, abs=1e-6)
    assert sum(spans.values()) == pytest.approx(0.45, abs=1e-6)


def test_a_notice_not_processed_or_a_job_with_no_new_generation_has_no_spans() -> None:
    instance = make_instance(make_team())
    sent = timezone.now()
    _notice(instance, received_at=sent, enqueued_at=sent)
    notice = {"instance": instance.pk, "sent_wall": sent.timestamp()}
    assert _reaction_stages(notice, published=0.5) is None
    assert _reaction_stages({**notice, "instance": instance.pk + 1000}, published=0.5) is None
    InterruptionNotice.objects.update(processed_at=sent, status=NoticeStatus.PROCESSED)
    assert _reaction_stages(notice, published=None) is None
