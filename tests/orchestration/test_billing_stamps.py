"""An instance's billing segments cover its life exactly: opened at its `running_at`, closed at its
`ended_at` (the chaos soak's ledger check found segments a few ms late at both ends: billed from a
later clock reading than the state change)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.billing.models import BillingSegment
from controlplane.fleet.models import Instance
from controlplane.orchestration import services
from tests.orchestration.test_services import _job, _start

pytestmark = pytest.mark.django_db


def test_segments_start_at_running_at_and_end_at_ended_at(fake):
    job = _job()
    instances = _start(job, fake)
    Instance.objects.filter(job=job).update(last_heartbeat_at=timezone.now())
    dead = instances[1]
    Instance.objects.filter(pk=dead.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=5))
    assert services.instances_detect_dead(timeout_s=2.0) == [dead.pk]

    for instance in Instance.objects.filter(pk__in=[i.pk for i in instances]):
        (segment,) = BillingSegment.objects.filter(instance=instance)
        assert segment.start == instance.running_at
        assert segment.end == instance.ended_at  # None for the live ones
    assert Instance.objects.get(pk=dead.pk).ended_at is not None
