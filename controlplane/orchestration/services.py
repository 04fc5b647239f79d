"""Orchestration: acquire and release spot capacity for jobs, keep it at the plan's size, and turn
nodes leaving or joining into new generations of the job.

Every function here is safe to run twice: acquisitions are keyed by a request token decided under
the job's row lock; providers adopt what an earlier launch with the same token started; a
reconfiguration is applied once (its status moves from `decided` to `applied` under the job lock).
Provider calls (network, seconds) run outside database transactions.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.billing.services import billing_close, billing_open
from controlplane.fleet.models import Instance, Lifecycle, ProviderKind
from controlplane.fleet.services import instance_transition
from controlplane.fleet.states import ALLOWED_TRANSITIONS, LIVE_STATES, TERMINAL_STATES, InstanceState
from controlplane.jobs.artifacts import job_latest_checkpoint
from controlplane.jobs.models import (
    ACTIVE_JOB_STATUSES,
    JOB_TRANSITIONS,
    JobEvent,
    JobStatus,
    MetricSample,
    Reconfiguration,
    ReconfigurationStatus,
    ReconfigurationTrigger,
    TrainingJob,
)
from controlplane.jobs.reconfiguration import current_generations, reconfiguration_decide
from controlplane.jobs.selectors import job_runtime_config
from controlplane.jobs.services import job_generation_publish, job_record_event, job_set_status
from controlplane.market.models import Cloud, InstanceType, Region, Zone
from controlplane.orchestration import reactions
from controlplane.orchestration.models import Acquisition, AcquisitionReason, AcquisitionStatus
from controlplane.orchestration.providers import AgentBootstrap, LaunchRequest, NodeInfo, Pool, get_provider
from controlplane.orchestration.providers.base import TAG_JOB, TAG_TEAM
from controlplane.orchestration.selectors import (
    COUNTED_STATES,
    job_counted_instances,
    job_current_generation,
    job_shape,
    pools_ranked,
    setting,
)
from controlplane.webhooks.alerts import alert_job_status
from runtime.strategies import get_strategy

logger = logging.getLogger(__name__)

# A launch claimed this long ago and never finished is assumed dead (its worker crashed).
LAUNCH_STALE_AFTER = timedelta(seconds=120)
# A node that never enrolled this long after launch is given up.
ENROLL_TIMEOUT = timedelta(seconds=180)


def _now() -> datetime:
    return timezone.now()


def heartbeat_timeout_s() -> float:
    """Seconds without a heartbeat after which a node is declared dead."""
    return setting("SPOTPIPE_HEARTBEAT_TIMEOUT_S", 2.0)


def _lock_job(job: TrainingJob) -> TrainingJob:
    return TrainingJob.objects.select_for_update().get(pk=job.pk)


def _job_set_status(job: TrainingJob, status: str, message: str, *, data: dict | None = None) -> None:
    """Move the job's status (the caller holds the job lock) and tell the team's alert URLs. A move
    the job's state machine refuses (a reaction that arrives after the job ended) changes nothing:
    a late event must not bring a failed or finished job back."""
    previous = job.status
    if status != previous and status not in JOB_TRANSITIONS[previous]:
        logger.warning("job %s stays %s: %s would be illegal (%s)", job.pk, previous, status, message)
        return
    if not job_set_status(job, status, message, data=data):
        return
    # Teams' outbound alert URLs hear of recovering / recovered / failed / finished.
    recovered = previous == JobStatus.RECOVERING and status == JobStatus.RUNNING
    alert_job_status(job=job, status="recovered" if recovered else status, message=message)


def _transition(instance: Instance, to: str, *, detail: dict | None = None) -> bool:
    """Move an instance if the state machine allows it (and keep its billing in step)."""
    instance.refresh_from_db(fields=["state"])
    if instance.state == to or to not in ALLOWED_TRANSITIONS[instance.state]:
        return False
    instance_transition(instance=instance, to=to, detail=detail or {})
    # Billed from the very instant the instance's life starts and ends (its stamps), not from a
    # later clock reading: the ledger must cover its life exactly.
    if to == InstanceState.RUNNING:
        billing_open(instance=instance, at=instance.running_at)
    elif to in TERMINAL_STATES:
        billing_close(instance=instance, at=instance.ended_at)
    return True


# --- enrolment keys --------------------------------------------------------------------------------


def _key_mac(request_token: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), f"enroll:{request_token}".encode(), hashlib.sha256).hexdigest()[:40]


def acquisition_enroll_key(*, acquisition: Acquisition) -> str:
    """The key a node of this acquisition enrols with: derived (HMAC of the request token), never
    stored, so a retried launch renders the same user-data."""
    return f"{acquisition.pk}.{_key_mac(acquisition.request_token)}"


def acquisition_from_enroll_key(*, key: str) -> Acquisition | None:
    acq_id, _, mac = key.partition(".")
    if not acq_id.isdigit() or not mac:
        return None
    acquisition = Acquisition.objects.select_related("job").filter(pk=int(acq_id)).first()
    if acquisition is None or not hmac.compare_digest(mac, _key_mac(acquisition.request_token)):
        return None
    return acquisition


# --- catalogue rows for provider answers ----------------------------------------------------------------


def _instance_type_row(provider: str, name: str) -> InstanceType:
    cloud, _ = Cloud.objects.get_or_create(code=provider, defaults={"name": provider})
    itype, _ = InstanceType.objects.get_or_create(cloud=cloud, name=name)
    return itype


def _zone_row(provider: str, code: str) -> Zone | None:
    if not code:
        return None
    zone = Zone.objects.filter(code=code, region__cloud__code=provider).first()
    if zone is not None:
        return zone
    cloud, _ = Cloud.objects.get_or_create(code=provider, defaults={"name": provider})
    region_code = code[:-1] if provider == "aws" and code[-1:].isalpha() else code
    region, _ = Region.objects.get_or_create(cloud=cloud, code=region_code)
    zone, _ = Zone.objects.get_or_create(region=region, code=code)
    return zone


def _pool_json(pool: Pool) -> dict[str, Any]:
    return {
        "instance_type": pool.instance_type,
        "zone": pool.zone,
        "price": str(pool.price) if pool.price is not None else None,
    }


# --- acquisition ----------------------------------------------------------------------------------------


@transaction.atomic
def capacity_request(*, job: TrainingJob, reason: str = AcquisitionReason.INITIAL) -> Acquisition | None:
    """Record an acquisition for the job's missing capacity (plan nodes minus counted instances),
    with one REQUESTED instance per node, under the job's lock. Returns None when nothing is
    missing, so calling it twice acquires once."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES:
        return None
    shape = job_shape(job=locked)
    missing = shape.nodes - len(job_counted_instances(job=locked))
    if missing <= 0:
        return None
    pools, avoided = pools_ranked(job=locked, shape=shape)
    number = Acquisition.objects.filter(job=locked).count() + 1
    now = _now()
    acquisition = Acquisition.objects.create(
        team_id=locked.team_id,
        job=locked,
        request_token=f"job{locked.pk}-acq{number}",
        provider=shape.provider,
        count=missing,
        pools=[_pool_json(p) for p in pools],
        avoided_pools=[_pool_json(p) for p in avoided],
        reason=reason,
        requested_at=now,
    )
    itype = _instance_type_row(shape.provider, pools[0].instance_type)
    zone = _zone_row(shape.provider, pools[0].zone)
    for index in range(missing):
        Instance.objects.create(
            team_id=locked.team_id,
            job=locked,
            provider=shape.provider,
            instance_type=itype,
            zone=zone,
            lifecycle=Lifecycle.SPOT,
            request_token=f"{acquisition.request_token}/{index}",
        )
    if locked.status == JobStatus.PENDING:
        _job_set_status(locked, JobStatus.PROVISIONING, f"acquiring {shape.nodes} node(s) from {shape.provider}")
    job_record_event(
        job=locked,
        kind="acquisition",
        message=f"requested {missing} {shape.provider} node(s) ({reason})",
        data={
            "acquisition": acquisition.pk,
            "count": missing,
            "pools": acquisition.pools,
            "avoided_pools": acquisition.avoided_pools,
        },
        at=now,
    )
    return acquisition


def _claim_launch(acquisition: Acquisition) -> bool:
    """Claim the launch of an acquisition (one runner at a time; a stale claim can be taken over)."""
    now = _now()
    with transaction.atomic():
        locked = Acquisition.objects.select_for_update().get(pk=acquisition.pk)
        stale = locked.launch_started_at is not None and now - locked.launch_started_at > LAUNCH_STALE_AFTER
        if locked.status == AcquisitionStatus.REQUESTED or (locked.status == AcquisitionStatus.LAUNCHING and stale):
            locked.status = AcquisitionStatus.LAUNCHING
            locked.launch_started_at = now
            locked.attempts += 1
            locked.save(update_fields=["status", "launch_started_at", "attempts"])
            return True
    return False


def control_plane_url() -> str:
    """Where agents reach the control plane (SPOTPIPE_PUBLIC_URL)."""
    return str(setting("SPOTPIPE_PUBLIC_URL", "http://127.0.0.1:8000")).rstrip("/")


def acquisition_launch(*, acquisition: Acquisition) -> list[Instance]:
    """Launch the nodes of an acquisition and attach their provider ids to its instances.

    Runs the provider call outside any transaction. If another runner holds the launch, returns
    without calling the provider; if the provider already launched for this token (a retry), it
    returns those nodes and nothing new is started."""
    from controlplane.orchestration.rendezvous import rendezvous_ensure

    acquisition.refresh_from_db()
    if acquisition.status in (AcquisitionStatus.FULFILLED, AcquisitionStatus.FAILED):
        return list(Instance.objects.filter(request_token__startswith=f"{acquisition.request_token}/"))
    # The store first: by the time the nodes enrol, the first generation can name it.
    rendezvous_ensure(job=acquisition.job)
    if not _claim_launch(acquisition):
        return []
    provider = get_provider(acquisition.provider)
    request = LaunchRequest(
        client_token=acquisition.request_token,
        count=acquisition.count,
        pools=tuple(Pool(instance_type=p["instance_type"], zone=p.get("zone") or "") for p in acquisition.pools),
        bootstrap=AgentBootstrap(
            control_plane_url=control_plane_url(),
            enroll_key=acquisition_enroll_key(acquisition=acquisition),
            cloud="aws"
            if acquisition.provider == ProviderKind.AWS
            else setting("SPOTPIPE_LOCAL_METADATA_CLOUD", "aws"),
            heartbeat_s=setting("SPOTPIPE_HEARTBEAT_S", 0.5),
        ),
        tags={TAG_JOB: str(acquisition.job_id), TAG_TEAM: str(acquisition.team_id)},
    )
    try:
        return acquisition_attach(acquisition=acquisition, nodes=provider.launch(request))
    except Exception as exc:
        # Give the claim back (the provider adopts what this try started), whether the provider or
        # the attach failed: a claim left behind would hold the launch for LAUNCH_STALE_AFTER.
        try:
            with transaction.atomic():
                Acquisition.objects.filter(pk=acquisition.pk, status=AcquisitionStatus.LAUNCHING).update(
                    status=AcquisitionStatus.REQUESTED, error=f"{type(exc).__name__}: {exc}"[:2000]
                )
        except Exception:
            logger.exception("could not release the launch claim of acquisition %s", acquisition.pk)
        raise


@transaction.atomic
def acquisition_attach(*, acquisition: Acquisition, nodes: list[NodeInfo]) -> list[Instance]:
    """Give each requested instance of the acquisition a launched node (in order), move it to
    pending, and mark the acquisition fulfilled. Instances left without a node have failed."""
    locked = Acquisition.objects.select_for_update().get(pk=acquisition.pk)
    instances = list(
        Instance.objects.select_for_update().filter(request_token__startswith=f"{locked.request_token}/").order_by("id")
    )
    known = {i.provider_instance_id for i in instances if i.provider_instance_id}
    fresh = [n for n in nodes if n.provider_instance_id not in known]
    attached = []
    for instance in instances:
        if instance.provider_instance_id:
            attached.append(instance)
            continue
        if not fresh:
            _transition(instance, InstanceState.FAILED, detail={"reason": "provider launched fewer nodes"})
            continue
        node = fresh.pop(0)
        instance.provider_instance_id = node.provider_instance_id
        instance.instance_type = _instance_type_row(locked.provider, node.instance_type or "unknown")
        instance.zone = _zone_row(locked.provider, node.zone)
        instance.agent_address = node.address[:200]
        instance.save(update_fields=["provider_instance_id", "instance_type", "zone", "agent_address", "updated_at"])
        _transition(
            instance,
            InstanceState.PENDING,
            detail={"acquisition": locked.pk, "pool": f"{node.instance_type}@{node.zone}"},
        )
        attached.append(instance)
    locked.status = AcquisitionStatus.FULFILLED
    locked.launched = len(attached)
    locked.fulfilled_at = _now()
    locked.error = ""
    locked.save(update_fields=["status", "launched", "fulfilled_at", "error"])
    job_record_event(
        job=locked.job,
        kind="acquired",
        message=f"{len(attached)} of {locked.count} node(s) launched",
        data={
            "acquisition": locked.pk,
            "instances": [i.pk for i in attached],
            "provider_ids": [i.provider_instance_id for i in attached],
        },
    )
    return attached


def job_start(*, job: TrainingJob) -> Acquisition | None:
    """Begin a pending job: request its plan's capacity (launch happens in a task)."""
    return capacity_request(job=job, reason=AcquisitionReason.INITIAL)


# --- agents -----------------------------------------------------------------------------------------------


def agent_enroll(
    *,
    enroll_key: str,
    provider_instance_id: str,
    address: str = "",
    identity_document: str = "",
    identity_signature: str = "",
) -> tuple[Instance, str]:
    """Exchange an acquisition's enrolment key and the node's provider id for an agent token bound
    to that instance. Raises DomainError (400) on a bad key, Conflict (409) when the node is not
    attached yet (the agent retries), and IdentityRejected (403) when the provider's identity check
    is enforced (aws) and the signed instance identity document does not prove the node is the
    launched instance in the configured account and region."""
    from controlplane.accounts.models import TokenKind
    from controlplane.accounts.services import api_token_create
    from controlplane.common.errors import Conflict, DomainError
    from controlplane.orchestration.identity import identity_policy_for, verify_identity_document

    acquisition = acquisition_from_enroll_key(key=enroll_key)
    if acquisition is None:
        raise DomainError("unknown or invalid enrolment key", field="enroll_key")
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
    policy = identity_policy_for(acquisition.provider)
    if policy is not None:
        verify_identity_document(
            document=identity_document,
            signature_b64=identity_signature,
            expected_instance_id=instance.provider_instance_id,
            policy=policy,
        )
    with transaction.atomic():
        _token, key = api_token_create(
            team=instance.team, kind=TokenKind.AGENT, instance=instance, name=f"agent {provider_instance_id}"
        )
        if address:
            instance.agent_address = address[:200]
        instance.last_heartbeat_at = _now()
        instance.save(update_fields=["agent_address", "last_heartbeat_at", "updated_at"])
        if instance.state in (InstanceState.REQUESTED, InstanceState.PENDING):
            _transition(instance, InstanceState.RUNNING, detail={"enrolled": True})
            transaction.on_commit(lambda: task_enqueue("instance_joined", instance.pk))
    return instance, key


def agent_commands(*, instance_id: int) -> dict[str, Any]:
    """What the agent of `instance_id` should do now: its job, the current generation and its own
    assignment in it, and an action (`run`, `standby`, `idle`, `stop`)."""
    from controlplane.jobs.artifacts import job_artifacts_location
    from controlplane.orchestration.selectors import instance_command_version

    instance = Instance.objects.select_related("job").get(pk=instance_id)
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
    generation = job_current_generation(job=job)
    if generation is None:
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


# --- generations and reactions ---------------------------------------------------------------------------


def _react_leave(job: TrainingJob, current: reactions.Slots, leaving: set[int],
                 noticed: set[int]) -> reactions.Reaction:
    """The reaction to `leaving`; when it would fail the job because every copy of some layer is
    gone, asked again with the job's newest checkpoint (listed only then: it may be on S3), which
    lets recycle, bamboo and oobleck restart from it as their workers would."""
    config = job_runtime_config(job)
    reaction = reactions.react_leave(config, current, leaving, noticed=noticed)
    if reaction.decision == "fail" and get_strategy(config.strategy).falls_back_to_checkpoint:
        step = job_latest_checkpoint(job=job)
        if step is not None:
            reaction = reactions.react_leave(config, current, leaving, noticed=noticed, checkpoint_step=step)
    return reaction


def _react_without_generation(job: TrainingJob, reaction: reactions.Reaction) -> None:
    """A leave after which the job cannot run now: it waits for replacements (`wait`), or, when its
    state is lost for good (`fail`), it fails with the runtime's reason instead of buying nodes."""
    if reaction.decision == "fail":
        job_fail(job=job, reason=reaction.reason)
    else:
        _job_set_status(job, JobStatus.RECOVERING, f"waiting for replacements: {reaction.reason}")


def _publish(job: TrainingJob, slots: reactions.Slots, *, decision: str, reason: str) -> Any:
    """Publish the next generation for `slots`: membership with runtime node ids, and a layout that
    names the strategy, the holes, the node ids and the rendezvous store the workers meet at."""
    from controlplane.orchestration.rendezvous import rendezvous_address

    shape = job_shape(job=job)
    previous = job_current_generation(job=job)
    known = {int(i): int(n) for i, n in (previous.layout.get("nodes", []) if previous else [])}
    nodes = reactions.assign_nodes(slots, known or None)
    layout = {
        "strategy": shape.strategy,
        "dp": shape.dp,
        "pp": shape.pp,
        "slots": slots,
        "decision": decision,
        "restart_from_checkpoint": decision == "restart",
        "holes": [list(h) for h in reactions.holes(slots)],
        "nodes": sorted([i, n] for i, n in nodes.items()),
        "rendezvous": rendezvous_address(job=job),
    }
    generation = job_generation_publish(
        job=job,
        membership=reactions.membership_of(slots, nodes),
        layout=layout,
        reason=reason,
    )
    degraded = bool(reactions.holes(slots))
    status = JobStatus.RECOVERING if degraded else JobStatus.RUNNING
    if job.status in ACTIVE_JOB_STATUSES:
        _job_set_status(
            job,
            status,
            f"generation {generation.number}: {reason}",
            data={"generation": generation.number, "strategy": shape.strategy},
        )
    return generation


def _current_slots(job: TrainingJob) -> reactions.Slots | None:
    generation = job_current_generation(job=job)
    if generation is None:
        return None
    return [list(row) for row in generation.layout.get("slots", [])]


def _running_ids(job: TrainingJob) -> list[int]:
    running = Instance.objects.filter(job=job, state=InstanceState.RUNNING).order_by("id")
    return list(running.values_list("pk", flat=True))


@transaction.atomic
def job_grow(*, job: TrainingJob, instance: Instance | None = None) -> Any:
    """A node joined (enrolled): publish the first generation once the plan's nodes run, or fill
    the job's holes with running nodes that are not yet members."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES:
        return None
    shape = job_shape(job=locked)
    running = _running_ids(locked)
    slots = _current_slots(locked)
    if slots is None:
        if len(running) < shape.dp * shape.pp:
            return None
        from controlplane.orchestration.rendezvous import rendezvous_address, rendezvous_enabled

        if rendezvous_enabled() and not rendezvous_address(job=locked):
            return None  # the store is still starting; the acquiring task publishes once it is up
        return _publish(
            locked,
            reactions.full_slots(running, dp=shape.dp, pp=shape.pp),
            decision="start",
            reason="initial membership",
        )
    members = set(reactions.alive(slots))
    joiners = [i for i in running if i not in members]
    if not joiners or not reactions.holes(slots):
        return None
    reaction = reactions.react_join(job_runtime_config(locked), slots, joiners)
    if reaction.slots is None:
        return None
    key = "join:" + ",".join(str(i) for i in joiners[: len(reactions.holes(slots))])
    trigger_instance = instance if instance is not None else Instance.objects.get(pk=joiners[0])
    reconfiguration = reconfiguration_decide(
        job=locked, trigger=ReconfigurationTrigger.JOIN, trigger_key=key, instance=trigger_instance
    )
    if reconfiguration.status != ReconfigurationStatus.DECIDED:
        return None
    decision = "restart" if shape.strategy in ("checkpoint", "none") else "grow"
    generation = _publish(locked, reaction.slots, decision=decision, reason=f"{reaction.reason} ({decision})")
    _mark_applied(reconfiguration, decision=decision, generation=generation.number)
    return generation


def reconfiguration_lost_seconds(*, reconfiguration: Reconfiguration, applied_at: datetime) -> float:
    """Training time the event cost, as the control plane can see it: the stall from the moment the
    node stopped contributing to the moment the job's next generation was published.

    - a death: from the node's last heartbeat (else the decision) to the new generation;
    - a notice: nothing when the new generation came before the node's deadline (the graceful
      case), else the time past the deadline;
    - a join: nothing.
    The in-flight step a kill makes the survivors redo is not counted (the runtime knows it, the
    control plane does not), so this is a lower bound."""
    if reconfiguration.trigger == ReconfigurationTrigger.JOIN:
        return 0.0
    if reconfiguration.trigger == ReconfigurationTrigger.NOTICE:
        deadline = reconfiguration.notice.deadline if reconfiguration.notice_id else None
        return max(0.0, (applied_at - deadline).total_seconds()) if deadline else 0.0
    instance = reconfiguration.instance
    stopped = (instance.last_heartbeat_at if instance else None) or reconfiguration.decided_at
    return max(0.0, (applied_at - stopped).total_seconds())


_APPLIED_FIELDS = ["decision", "to_generation", "status", "applied_at", "lost_seconds"]


def _set_applied(reconfiguration: Reconfiguration, *, decision: str, generation: int | None) -> None:
    """Mark applied in memory (the caller saves)."""
    reconfiguration.decision = decision
    reconfiguration.to_generation = generation
    reconfiguration.status = ReconfigurationStatus.APPLIED
    reconfiguration.applied_at = _now()
    # Priced by the cost report as work lost to preemptions.
    reconfiguration.lost_seconds = reconfiguration_lost_seconds(
        reconfiguration=reconfiguration, applied_at=reconfiguration.applied_at
    )


def _mark_applied(reconfiguration: Reconfiguration, *, decision: str, generation: int | None) -> None:
    _set_applied(reconfiguration, decision=decision, generation=generation)
    reconfiguration.save(update_fields=_APPLIED_FIELDS)


def reconfiguration_apply(*, reconfiguration: Reconfiguration) -> Any:
    """Act on one decided reconfiguration for a leaving node: a batch of one
    (`reconfigurations_apply`, the one place a leave is reacted to). Returns the generation it
    published, or None (it waited, failed the job, had nothing to change, or was applied already)."""
    return reconfigurations_apply(reconfigurations=[reconfiguration]).get(reconfiguration.pk)


@transaction.atomic
def reconfigurations_apply(*, reconfigurations: list[Reconfiguration]) -> dict[int, Any]:
    """Apply a batch of decided leave reconfigurations (the notice processor's, on commit) in one
    transaction, with the same end state as `reconfiguration_apply` called for each in turn, in
    the order they were decided (id order).

    Applying in turn, each one locks its job, reads the current generation and the job's running
    nodes, and either does nothing (`none`: the job is not active, has no generation yet, or the
    node is no longer a member), waits for replacements, or publishes a generation without every
    member that is not running. Between two of them only the generation and the job's status
    change (nothing here moves an instance), so this reads the jobs (locked, in id order), the
    reconfigurations (locked), the current generations and the running nodes once for the batch,
    replays that sequence in memory, and writes the reconfigurations with one statement. What
    does change a job (a new generation, a status change: one per job and batch in practice, as
    the first publish already leaves out every node that is not running) goes through the same
    `_publish` / `_job_set_status` as `reconfiguration_apply`.

    Returns {reconfiguration id: the generation it published, or None}. Reconfigurations that are
    no longer `decided` (applied by someone else meanwhile) or are joins are left alone."""
    from controlplane.fleet.bulk import bulk_update_by_pk

    job_ids = sorted({r.job_id for r in reconfigurations})
    if not job_ids:
        return {}
    # Jobs first, then reconfigurations: the lock order of reconfiguration_apply (no deadlock).
    jobs = {job.pk: job for job in TrainingJob.objects.select_for_update().filter(pk__in=job_ids).order_by("pk")}
    rows = list(
        Reconfiguration.objects.select_for_update(of=("self",))
        .select_related("notice", "instance")
        .filter(pk__in=[r.pk for r in reconfigurations], status=ReconfigurationStatus.DECIDED)
        .exclude(trigger=ReconfigurationTrigger.JOIN)
        .order_by("pk")
    )
    if not rows:
        return {}
    # Slots of each active job's current generation, and its running nodes: read once.
    generations = current_generations(jobs=[job for job in jobs.values() if job.status in ACTIVE_JOB_STATUSES])
    slots = {pk: [list(row) for row in g.layout.get("slots", [])] for pk, g in generations.items()}
    running: dict[int, set[int]] = {pk: set() for pk in slots}
    noticed: set[int] = set()  # still here, leaving: the runtime may keep them until a replacement joins
    if slots:
        for job_id, pk, state in Instance.objects.filter(
            job_id__in=slots, state__in=(InstanceState.RUNNING, InstanceState.NOTICE)
        ).values_list("job_id", "pk", "state"):
            (running[job_id] if state == InstanceState.RUNNING else noticed).add(pk)
    published: dict[int, Any] = {}
    reconcile: list[int] = []
    for reconfiguration in rows:
        job = jobs[reconfiguration.job_id]
        published[reconfiguration.pk] = None
        if job.status not in ACTIVE_JOB_STATUSES:
            _set_applied(reconfiguration, decision="none", generation=None)
            continue
        current = slots.get(job.pk)
        alive = set(reactions.alive(current or []))
        leaving = alive - running.get(job.pk, set())
        if reconfiguration.instance_id:
            leaving.add(reconfiguration.instance_id)
        if current is None or not leaving & alive:
            _set_applied(reconfiguration, decision="none", generation=None)
            continue
        reaction = _react_leave(job, current, leaving, noticed & leaving)
        if job.pk not in reconcile:
            reconcile.append(job.pk)
        if reaction.slots is None:
            _set_applied(reconfiguration, decision=reaction.decision, generation=None)
            _react_without_generation(job, reaction)
            continue
        generation = _publish(
            job,
            reaction.slots,
            decision=reaction.decision,
            reason=f"{reconfiguration.trigger} {sorted(leaving)}: {reaction.decision}",
        )
        slots[job.pk] = [list(row) for row in generation.layout.get("slots", [])]
        _set_applied(reconfiguration, decision=reaction.decision, generation=generation.number)
        published[reconfiguration.pk] = generation
    bulk_update_by_pk(Reconfiguration, rows, _APPLIED_FIELDS)
    # One reconcile per job (applying in turn enqueues one per reconfiguration that waited or
    # published; the task is idempotent, so the extra ones did nothing).
    if reconcile:
        transaction.on_commit(lambda: [task_enqueue("reconcile_job", pk) for pk in reconcile])
    return published


def reconfigurations_pending(*, job: TrainingJob | None = None) -> list[int]:
    qs = Reconfiguration.objects.filter(status=ReconfigurationStatus.DECIDED).exclude(
        trigger=ReconfigurationTrigger.JOIN
    )
    if job is not None:
        qs = qs.filter(job=job)
    return list(qs.order_by("decided_at").values_list("pk", flat=True))


# --- death detection ------------------------------------------------------------------------------------


def instance_mark_lost(*, instance: Instance, reason: str, notice_id: int | None = None) -> Reconfiguration | None:
    """A node is gone (heartbeat timeout, the provider says it ended): mark it preempted (spot) or
    failed, and decide the job's reconfiguration (once per leaving node)."""
    with transaction.atomic():
        target = InstanceState.PREEMPTED if instance.lifecycle == Lifecycle.SPOT else InstanceState.FAILED
        moved = _transition(instance, target, detail={"reason": reason})
        if not moved or instance.job_id is None:
            return None
        job_record_event(
            job=instance.job,
            kind="instance_lost",
            message=f"instance {instance.pk} ({instance.provider_instance_id}) lost: {reason}",
            data={"instance": instance.pk, "reason": reason},
        )
        reconfiguration = reconfiguration_decide(
            job=instance.job,
            trigger=ReconfigurationTrigger.DEATH,
            trigger_key=f"leave:instance:{instance.pk}",
            instance=instance,
        )
    return reconfiguration


def instance_terminate(*, instance: Instance, reason: str) -> Reconfiguration | None:
    """An operator ends a node: its provider is asked to terminate it, the row moves to
    terminated (billing closed, agent token revoked) and, when it served a job that is still
    active, the job reacts as to any leave (a reconfiguration decided, then applied here; the
    reconciler applies it later if applying fails now). An instance already ended is a Conflict;
    a provider that refuses raises ProviderError and nothing is written."""
    from controlplane.common.errors import Conflict

    instance.refresh_from_db(fields=["state"])
    if instance.state in TERMINAL_STATES:
        raise Conflict(f"instance {instance.pk} is already {instance.state}", field="state")
    if instance.provider_instance_id:
        get_provider(instance.provider).terminate([instance.provider_instance_id])
    reconfiguration = None
    with transaction.atomic():
        if not _transition(instance, InstanceState.TERMINATED, detail={"reason": reason}):
            raise Conflict(f"instance {instance.pk} ended meanwhile ({instance.state})", field="state")
        job = instance.job if instance.job_id is not None else None
        if job is not None and job.status in ACTIVE_JOB_STATUSES:
            message = f"instance {instance.pk} ({instance.provider_instance_id}) terminated: {reason}"
            job_record_event(job=job, kind="instance_terminated", message=message[:300],
                             data={"instance": instance.pk, "reason": reason})
            reconfiguration = reconfiguration_decide(
                job=job, trigger=ReconfigurationTrigger.DEATH, trigger_key=f"leave:instance:{instance.pk}",
                instance=instance,
            )
    if reconfiguration is not None:
        try:
            reconfiguration_apply(reconfiguration=reconfiguration)
        except Exception:  # the reconciler applies decided reconfigurations nobody applied
            logger.exception("applying reconfiguration %s after terminating instance %s", reconfiguration.pk,
                             instance.pk)
    return reconfiguration


def instances_detect_dead(*, timeout_s: float | None = None, now: datetime | None = None) -> list[int]:
    """Running nodes whose last heartbeat is older than the timeout, and pending nodes that never
    enrolled: mark them lost and react. Returns the instance ids."""
    now = now or _now()
    cutoff = now - timedelta(seconds=timeout_s if timeout_s is not None else heartbeat_timeout_s())
    dead = list(
        Instance.objects.select_related("job").filter(
            state__in=(InstanceState.RUNNING, InstanceState.NOTICE), last_heartbeat_at__lt=cutoff
        )
    )
    stuck = list(
        Instance.objects.select_related("job").filter(
            state__in=(InstanceState.REQUESTED, InstanceState.PENDING), created_at__lt=now - ENROLL_TIMEOUT
        )
    )
    lost = []
    for instance in dead:
        reconfiguration = instance_mark_lost(instance=instance, reason="heartbeat timeout")
        lost.append(instance.pk)
        if reconfiguration is not None:
            reconfiguration_apply(reconfiguration=reconfiguration)
    for instance in stuck:
        with transaction.atomic():
            if _transition(instance, InstanceState.FAILED, detail={"reason": "never enrolled"}):
                lost.append(instance.pk)
    return lost


# --- reconcile and release --------------------------------------------------------------------------------


# After the last step, how long to wait for the members' workers to exit on their own (they save
# their final state) before the job is declared finished and its nodes released anyway.
FINISH_GRACE = timedelta(seconds=30)
# Exit code of an agent's worker whose runtime found that the job cannot go on
# (agent.worker_entry.EXIT_JOB_FAILED; the control plane does not import the agent).
WORKER_EXIT_JOB_FAILED = 4


def job_stall_timeout_s() -> float:
    """Seconds a running job may go without progress (a committed step, a new generation) before
    the reconcile loop fails it: the safety net for a runtime that died without saying why."""
    return setting("SPOTPIPE_JOB_STALL_TIMEOUT_S", 600.0)


@transaction.atomic
def job_fail(*, job: TrainingJob, reason: str, data: dict | None = None) -> bool:
    """Mark an active job failed with `reason` on its timeline (the status alert goes out with the
    status change) and release its nodes once this commits. Idempotent: False when it had ended."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES:
        return False
    _job_set_status(locked, JobStatus.FAILED, reason, data={"reason": reason, **(data or {})})
    transaction.on_commit(lambda: task_enqueue("reconcile_job", locked.pk))
    return True


def worker_exit_report(*, instance: Instance, code: int | None, reason: str, generation: int | None) -> bool:
    """An agent's worker exited. When its runtime said the job cannot go on, the job fails with
    that reason (strategies that restart from a checkpoint do so inside the runtime, so a failure
    that reaches here had no checkpoint to restart from). Returns True when the job was failed."""
    if instance.job is None or code != WORKER_EXIT_JOB_FAILED:
        return False
    return job_fail(
        job=instance.job,
        reason=f"runtime cannot continue: {reason or 'no reason given'}",
        data={"instance": instance.pk, "generation": generation},
    )


def requirements_failed_report(*, instance: Instance, reason: str) -> bool:
    """An agent could not install the job's requirements (`config.requirements`): the job fails
    with pip's last lines. Every node would fail the same way, so no replacement is bought and the
    agent does not retry. Returns True when the job was failed (False: it had ended already)."""
    if instance.job is None:
        return False
    return job_fail(job=instance.job, reason=f"requirements could not be installed: {reason or 'no reason given'}",
                    data={"instance": instance.pk})


def _last_progress(job: TrainingJob) -> datetime | None:
    """When the job last moved: its newest metric sample, generation or line of a node installing its
    requirements (a long pip install is not a stall; None before it ran)."""
    sample = MetricSample.objects.filter(job=job).order_by("-at").values_list("at", flat=True).first()
    generation = job_current_generation(job=job)
    installing = (JobEvent.objects.filter(job=job, kind="agent_requirements_output").order_by("-at")
                  .values_list("at", flat=True).first())
    moments = [m for m in (sample, generation.created_at if generation else None, installing) if m is not None]
    return max(moments) if moments else None


def job_fail_if_stalled(*, job: TrainingJob, now: datetime | None = None) -> bool:
    """Fail a running (or recovering) job whose members all stopped reporting progress for longer
    than SPOTPIPE_JOB_STALL_TIMEOUT_S. Returns True when it did."""
    if job.status not in (JobStatus.RUNNING, JobStatus.RECOVERING):
        return False
    last = _last_progress(job)
    timeout = job_stall_timeout_s()
    if last is None or ((now or _now()) - last).total_seconds() <= timeout:
        return False
    return job_fail(
        job=job,
        reason=f"no progress for {timeout:.0f} s (last at {last.isoformat()}): its workers stopped reporting",
        data={"last_progress": last.isoformat()},
    )


def _workers_done(job: TrainingJob) -> bool:
    """Every member of the current generation reported its worker's clean exit."""
    generation = job_current_generation(job=job)
    members = {m["instance"] for m in (generation.membership if generation else [])}
    exited = set(
        JobEvent.objects.filter(job=job, kind="agent_worker_exit", data__code=0).values_list(
            "data__instance", flat=True
        )
    )
    return members <= exited


@transaction.atomic
def job_finish(*, job: TrainingJob) -> bool:
    """Mark the job finished once its steps are done and its workers have exited (or the grace
    period after the last step ran out). Idempotent."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES or locked.steps_done < locked.target_steps:
        return False
    reached = (
        MetricSample.objects.filter(job=locked, step__gte=locked.target_steps)
        .order_by("at")
        .values_list("at", flat=True)
        .first()
    )
    if not _workers_done(locked) and reached is not None and _now() - reached < FINISH_GRACE:
        return False
    _job_set_status(locked, JobStatus.FINISHED, f"finished {locked.steps_done} steps")
    return True


def capacity_release(*, job: TrainingJob) -> list[int]:
    """Terminate every live node of the job (finished, failed or cancelled) and close their billing."""
    instances = list(Instance.objects.filter(job=job, state__in=LIVE_STATES))
    by_provider: dict[str, list[Instance]] = {}
    for instance in instances:
        by_provider.setdefault(instance.provider, []).append(instance)
    for provider_kind, group in by_provider.items():
        ids = [i.provider_instance_id for i in group if i.provider_instance_id]
        if ids:
            get_provider(provider_kind).terminate(ids)
    released = []
    for instance in instances:
        with transaction.atomic():
            if _transition(instance, InstanceState.TERMINATED, detail={"reason": f"job {job.status}"}):
                released.append(instance.pk)
    if released:
        job_record_event(
            job=job, kind="released", message=f"released {len(released)} node(s)", data={"instances": released}
        )
    from controlplane.orchestration.rendezvous import rendezvous_release

    rendezvous_release(job=job)
    return released


def capacity_reconcile(*, job: TrainingJob) -> dict[str, Any]:
    """Compare desired and actual capacity of one job and repair the difference:
    - a finished/cancelled/failed job has all its nodes released (a job with no progress for
      SPOTPIPE_JOB_STALL_TIMEOUT_S is failed first);
    - nodes the provider reports gone are marked lost (and the job reacts);
    - decided reconfigurations nobody applied are applied;
    - missing capacity is requested (cheapest pool that fits, avoiding pools that just preempted us)
      and launched; surplus nodes that are not members are terminated.
    Idempotent: run it as often as you like."""
    job.refresh_from_db()
    report: dict[str, Any] = {"job": job.pk, "lost": [], "requested": 0, "launched": 0, "released": [], "surplus": []}
    if job_finish(job=job) or job_fail_if_stalled(job=job):
        job.refresh_from_db()
    if job.status not in ACTIVE_JOB_STATUSES:
        report["released"] = capacity_release(job=job)
        return report
    # Drift: ask the provider about the nodes we believe alive.
    live = [
        i
        for i in Instance.objects.filter(
            job=job, state__in=(InstanceState.PENDING, InstanceState.RUNNING, InstanceState.NOTICE)
        )
        if i.provider_instance_id
    ]
    by_provider: dict[str, list[Instance]] = {}
    for instance in live:
        by_provider.setdefault(instance.provider, []).append(instance)
    for provider_kind, group in by_provider.items():
        states = {
            n.provider_instance_id: n.state
            for n in get_provider(provider_kind).describe([i.provider_instance_id for i in group])
        }
        for instance in group:
            if states.get(instance.provider_instance_id) in ("terminated", "missing", "stopping"):
                reconfiguration = instance_mark_lost(instance=instance, reason="provider reports it gone")
                report["lost"].append(instance.pk)
                if reconfiguration is not None:
                    reconfiguration_apply(reconfiguration=reconfiguration)
    for pk in reconfigurations_pending(job=job):
        reconfiguration_apply(reconfiguration=Reconfiguration.objects.get(pk=pk))
    job.refresh_from_db()
    reason = AcquisitionReason.REPLACEMENT if job.current_generation else AcquisitionReason.INITIAL
    acquisition = capacity_request(job=job, reason=reason)
    if acquisition is not None:
        report["requested"] = acquisition.count
    for pending in Acquisition.objects.filter(
        job=job, status__in=(AcquisitionStatus.REQUESTED, AcquisitionStatus.LAUNCHING)
    ):
        report["launched"] += len(acquisition_launch(acquisition=pending))
    job_grow(job=job)
    report["surplus"] = _terminate_surplus(job)
    return report


def _terminate_surplus(job: TrainingJob) -> list[int]:
    """Nodes beyond the plan that are not members of the current generation (a replacement that
    arrived after the job already grew back, say)."""
    shape = job_shape(job=job)
    counted = job_counted_instances(job=job)
    extra = len(counted) - shape.nodes
    if extra <= 0:
        return []
    members = set(reactions.alive(_current_slots(job) or []))
    spare = [i for i in reversed(counted) if i.pk not in members and i.state == InstanceState.RUNNING][:extra]
    ids = [i.provider_instance_id for i in spare if i.provider_instance_id]
    if ids:
        get_provider(shape.provider).terminate(ids)
    for instance in spare:
        with transaction.atomic():
            _transition(instance, InstanceState.TERMINATED, detail={"reason": "surplus"})
    return [i.pk for i in spare]


def active_job_ids() -> list[int]:
    """Jobs that hold or want capacity (and ended jobs that still hold some)."""
    ids = {
        pk
        for pk, status, plan in TrainingJob.objects.filter(status__in=ACTIVE_JOB_STATUSES).values_list(
            "pk", "status", "plan"
        )
        if status != JobStatus.PENDING or plan
    }
    ids |= set(
        Instance.objects.filter(state__in=COUNTED_STATES | {InstanceState.NOTICE}, job__isnull=False).values_list(
            "job_id", flat=True
        )
    )
    return sorted(ids)


def task_enqueue(task_name: str, *args: Any) -> None:
    """Publish an orchestration task (called on commit). A broker that is down is logged: the
    periodic reconcile repairs whatever the task would have done."""
    from controlplane.orchestration import tasks

    try:
        getattr(tasks, task_name).delay(*args)
    except Exception:
        logger.exception("could not enqueue %s%s; the periodic reconcile will catch up", task_name, args)
