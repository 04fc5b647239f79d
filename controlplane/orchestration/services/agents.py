"""Agents: a node's enrolment, the commands its agent polls for, and the notices it reports."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from controlplane.common.errors import DomainError
from controlplane.fleet.locks import lock_instance
from controlplane.fleet.models import Instance
from controlplane.fleet.states import TERMINAL_STATES, InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES
from controlplane.jobs.prepare_step import prepare_location
from controlplane.orchestration.enqueue import enqueue_on_commit
from controlplane.orchestration.selectors import job_current_generation
from controlplane.orchestration.services.enrolment_keys import acquisition_from_enroll_key
from controlplane.orchestration.services.transitions import _now, _transition
from controlplane.planning.plans import JobPlan


class EnrollKeyRejected(DomainError):
    """The enrolment key is unknown or forged: the node's only credential, so 403 (not a bad field)."""

    status_code = 403


def agent_enroll(
    *,
    enroll_key: str,
    provider_instance_id: str,
    address: str = "",
    identity_document: str = "",
    identity_signature: str = "",
) -> tuple[Instance, str]:
    """Exchange an acquisition's enrolment key and the node's provider id for an agent token bound
    to that instance. Raises EnrollKeyRejected (403) on an unknown or bad key, Conflict (409) when the node is not
    attached yet (the agent retries), and IdentityRejected (403) when the provider's identity check
    is enforced (aws) and the signed instance identity document does not prove the node is the
    launched instance in the configured account and region."""
    from controlplane.accounts.models import TokenKind
    from controlplane.accounts.services import api_token_create
    from controlplane.common.errors import Conflict

    # Imported here, not at the top: the tasks module imports these services (its tasks wrap them)
    # and the task enqueued here calls them back, a true import cycle.
    from controlplane.orchestration import tasks
    from controlplane.orchestration.identity import identity_policy_for, verify_identity_document

    acquisition = acquisition_from_enroll_key(key=enroll_key)
    if acquisition is None:
        raise EnrollKeyRejected("unknown or invalid enrolment key", field="enroll_key")
    instance = Instance.objects.filter(
        job_id=acquisition.job_id,
        provider_instance_id=provider_instance_id,
        request_token__startswith=f"{acquisition.request_token}/",
    ).first()
    if instance is None:
        raise Conflict(
            f"node {provider_instance_id!r} is not attached to acquisition {acquisition.pk} yet; retry",
            field="provider_instance_id",
        )
    if instance.state in TERMINAL_STATES:
        raise Conflict(f"instance {instance.pk} is {instance.state}; it cannot enrol", field="provider_instance_id")
    # A node's document names the region it was launched in, verified with that region's certificate.
    region = instance.zone.region.code if acquisition.provider == "aws" and instance.zone_id else ""
    policy = identity_policy_for(acquisition.provider, region=region)
    if policy is not None:
        verify_identity_document(
            document=identity_document,
            signature_b64=identity_signature,
            expected_instance_id=instance.provider_instance_id,
            policy=policy,
        )
    with transaction.atomic():
        # Its job, then it (the one lock order): the token's row and the move below need both.
        instance = lock_instance(instance)
        _token, key = api_token_create(
            team=instance.team, kind=TokenKind.AGENT, instance=instance, name=f"agent {provider_instance_id}"
        )
        if address:
            instance.agent_address = address[:200]
        instance.last_heartbeat_at = _now()
        instance.save(update_fields=["agent_address", "last_heartbeat_at", "updated_at"])
        if instance.state in (InstanceState.REQUESTED, InstanceState.PENDING):
            _transition(instance, InstanceState.RUNNING, detail={"enrolled": True})
            enqueue_on_commit(tasks.instance_joined, instance.pk)
    return instance, key


def agent_commands(*, instance_id: int) -> dict[str, Any]:
    """What the agent of `instance_id` should do now: its job, the current generation and its own
    assignment in it, and an action (`run`, `standby`, `idle`, `stop`)."""
    instance = Instance.objects.select_related("job").get(pk=instance_id)
    return _commands(instance, job_current_generation(job=instance.job) if instance.job else None)


def agent_commands_many(*, instance_ids: list[int]) -> dict[int, dict[str, Any]]:
    """`agent_commands` of many instances in three queries, whatever their number (a new generation
    wakes every agent of its job at once); an unknown id is left out."""
    from controlplane.jobs.models import JobGeneration

    instances = list(Instance.objects.select_related("job").filter(pk__in=instance_ids))
    wanted = {(i.job_id, i.job.current_generation) for i in instances if i.job and i.job.current_generation}
    generations = {}
    if wanted:
        query = Q()
        for job_id, number in wanted:
            query |= Q(job_id=job_id, number=number)
        generations = {(g.job_id, g.number): g for g in JobGeneration.objects.filter(query)}
    return {i.pk: _commands(i, generations.get((i.job_id, i.job.current_generation)) if i.job else None)
            for i in instances}


def _commands(instance: Instance, generation: Any) -> dict[str, Any]:
    """The answer for `instance` (with its `job` loaded) and its job's current `generation`."""
    from controlplane.jobs.artifacts import job_artifacts_location
    from controlplane.orchestration.selectors import instance_command_version

    job = instance.job
    version = instance_command_version(instance=instance)
    answer: dict[str, Any] = {
        "version": version,
        "instance": instance.pk,
        "provider_instance_id": instance.provider_instance_id,
        "job": None,
        "generation": None,
        "assignment": None,
        "action": "idle",
    }
    if instance.state in TERMINAL_STATES:
        answer["action"] = "stop"
        return answer
    if job is None:
        return answer
    answer["job"] = {
        "id": job.pk,
        "status": job.status,
        "strategy": job.strategy,
        "target_steps": job.target_steps,
        "config": job.config,
        "plan": job.plan,
        "steps_done": job.steps_done,
        # The job's folder in the artifact store: the workers export the final weights there.
        "artifacts": job_artifacts_location(job=job),
    }
    if job.status not in ACTIVE_JOB_STATUSES:
        answer["action"] = "stop"
        return answer
    if generation is None:
        if JobPlan.from_dict(job.plan).awaiting_profile:
            # Its first node measures the model (`runtime.train.node_profile`) before the job is planned.
            answer["action"] = "profile"
        elif prepare_location(job):
            # Its nodes prepare its data into shards first, each asking for a share (`services.prepare`).
            answer["action"] = "prepare"
        return answer
    answer["generation"] = {
        "number": generation.number,
        "membership": generation.membership,
        "layout": generation.layout,
        "created_at": generation.created_at.isoformat(),
    }
    member = next((m for m in generation.membership if m.get("instance") == instance.pk), None)
    answer["assignment"] = member
    answer["action"] = "run" if member is not None else "standby"
    return answer


def agent_notice(
    *,
    instance: Instance,
    kind: str,
    action: str = "",
    deadline: datetime | None = None,
    cloud: str = "",
    payload: dict | None = None,
) -> int | None:
    """Store a notice the agent saw in its metadata endpoint (once per instance and kind) and hand it
    to workers; returns the stored notice id (None for a duplicate)."""
    from controlplane.fleet.models import NoticeSource
    from controlplane.fleet.notices import NoticeDraft, notices_store

    draft = NoticeDraft(
        team_id=instance.team_id,
        source=NoticeSource.AGENT,
        kind=kind,
        action=action,
        dedup_key=f"agent:{instance.provider or 'local'}:{instance.provider_instance_id}:{kind}",
        provider_instance_id=instance.provider_instance_id or "",
        event_time=_now(),
        deadline=deadline,
        payload={"cloud": cloud, "metadata": payload or {}},
    )
    result = notices_store(drafts=[draft])
    return next(iter(result.stored.values()), None)
