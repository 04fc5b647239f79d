"""Reads on instances and interruption notices, with what their serializers touch joined."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from controlplane.fleet.models import Instance, InstanceEvent, InterruptionNotice


def instance_list(*, team_ids: Iterable[int]) -> QuerySet[Instance]:
    """Instances of `team_ids`, newest first."""
    return (
        Instance.objects.filter(team_id__in=list(team_ids))
        .select_related("team", "job", "instance_type__cloud", "zone__region")
        .order_by("-created_at", "-id")
    )


def instance_event_list(*, instance: Instance) -> QuerySet[InstanceEvent]:
    return InstanceEvent.objects.filter(instance_id=instance.pk).order_by("at", "id")


def notice_list(*, team_ids: Iterable[int]) -> QuerySet[InterruptionNotice]:
    """Notices of `team_ids`, newest first. Notices for unknown instances with no team are seen
    only in the admin, since no team can be shown to own them."""
    return (
        InterruptionNotice.objects.filter(team_id__in=list(team_ids))
        .select_related("instance")
        .order_by("-received_at", "-id")
    )
