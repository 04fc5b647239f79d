"""Acquisition: record a job's missing capacity, launch it at the provider, attach the launched
nodes to their instances."""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from typing import Any

from django.db import transaction

from controlplane.fleet.bulk import bulk_update_by_pk
from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance, Lifecycle, ProviderKind
from controlplane.fleet.services import instance_transition_locked, instances_moved_save
from controlplane.fleet.states import ALLOWED_TRANSITIONS, LIVE_STATES, TERMINAL_STATES, InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobEvent, JobStatus, TrainingJob
from controlplane.jobs.services import job_record_event
from controlplane.market.zones import pool_region
from controlplane.orchestration.models import Acquisition, AcquisitionReason, AcquisitionStatus
from controlplane.orchestration.offerings import offerings_mark_no_capacity, pool_unavailability, unavailable_ttl
from controlplane.orchestration.providers import AgentBootstrap, LaunchRequest, NodeInfo, Pool, get_provider
from controlplane.orchestration.providers.base import TAG_JOB, TAG_TEAM, InsufficientCapacity
from controlplane.orchestration.selectors import job_counted_count, pools_ranked
from controlplane.orchestration.services.catalogue import _instance_type_row, _pool_json, _zone_row
from controlplane.orchestration.services.enrolment_keys import acquisition_enroll_key
from controlplane.orchestration.services.transitions import _end_locked_many, _job_set_status, _lock_job, _now
from controlplane.planning.plans import JobPlan
from controlplane.tunables import tunable
from runtime.planner.capacity_policy import ON_DEMAND, SPOT

logger = logging.getLogger(__name__)

ATTACH_FIELDS = ("provider_instance_id", "instance_type", "zone", "agent_address", "updated_at")
"""What attaching a launched node writes on its instance (its state move is written apart)."""

# A launch claimed this long ago and never finished is assumed dead (its worker crashed).
LAUNCH_STALE_AFTER = timedelta(seconds=120)


def job_region(job: TrainingJob) -> str | None:
    """The region of the job's live nodes (None when it holds none, or only nodes not yet placed)."""
    codes = (Instance.objects.filter(job=job, state__in=LIVE_STATES, zone__isnull=False)
             .exclude(provider_instance_id=None).values_list("zone__region__code", flat=True)
             .order_by("zone__region__code").distinct())
    return codes.first()


def job_capacity_type(job: TrainingJob) -> str:
    """What the job's nodes are bought as now (`spot` or `on_demand`): its capacity policy's current
    choice (`TrainingJob.capacity_type`)."""
    return job.capacity_type or SPOT


@transaction.atomic
def capacity_request(*, job: TrainingJob, reason: str = AcquisitionReason.INITIAL) -> Acquisition | None:
    """Record an acquisition for the job's missing capacity (plan nodes minus counted instances),
    with one REQUESTED instance per node, under the job's lock. Returns None when nothing is
    missing, so calling it twice acquires once, and when every offering of the plan is marked
    without capacity (the job waits for the first mark to expire; its timeline says so once)."""
    locked = _lock_job(job)
    if locked.status not in ACTIVE_JOB_STATUSES or locked.status == JobStatus.STOPPING:
        return None  # a stopping job checkpoints on what it holds
    plan = JobPlan.from_dict(locked.plan)
    capacity_type = job_capacity_type(locked)
    # Only nodes of the type the policy buys now count: after a switch the job acquires the other
    # type in full, and the old nodes are retired one by one once the new ones run
    # (`capacity_policy.other_capacity_retire`).
    missing = plan.nodes - job_counted_count(job=locked, lifecycle=capacity_type)
    if missing <= 0:
        return None
    # A job's nodes stay in one region (traffic between regions is slow and billed): while it holds
    # nodes, it grows back only where they are.
    ranked = pools_ranked(job=locked, plan=plan, capacity_type=capacity_type, region=job_region(locked))
    if not ranked.usable:
        _record_capacity_wait(locked, missing=missing, unavailable=ranked.unavailable, capacity_type=capacity_type)
        return None
    # One region a launch: the cheapest usable pool's.
    first = pool_region(plan.provider, ranked.usable[0].zone, ranked.usable[0].region)
    pools = [p for p in ranked.usable if pool_region(plan.provider, p.zone, p.region) == first]
    number = Acquisition.objects.filter(job=locked).count() + 1
    now = _now()
    acquisition = Acquisition.objects.create(
        team_id=locked.team_id,
        job=locked,
        # The random tail keeps two control planes on one cloud account (staging and production,
        # or one rebuilt from scratch) from adopting each other's launches by `ClientToken` or tag.
        request_token=f"job{locked.pk}-acq{number}-{secrets.token_hex(4)}",
        provider=plan.provider,
        count=missing,
        pools=[_pool_json(p) for p in pools],
        avoided_pools=[_pool_json(p) for p in ranked.cooling + ranked.unavailable],
        capacity_type=capacity_type,
        reason=reason,
        requested_at=now,
    )
    itype = _instance_type_row(plan.provider, pools[0].instance_type)
    zone = _zone_row(plan.provider, pools[0].zone)
    lifecycle = Lifecycle.ON_DEMAND if capacity_type == ON_DEMAND else Lifecycle.SPOT
    # One insert for all of them: a 1,024-node start held the job's lock for one insert a node.
    Instance.objects.bulk_create([
        Instance(
            team_id=locked.team_id,
            job=locked,
            provider=plan.provider,
            instance_type=itype,
            zone=zone,
            lifecycle=lifecycle,
            request_token=f"{acquisition.request_token}/{index}",
        )
        for index in range(missing)
    ])
    if locked.status == JobStatus.PENDING:
        _job_set_status(locked, JobStatus.PROVISIONING, f"acquiring {plan.nodes} node(s) from {plan.provider}")
    kind_label = "on-demand " if capacity_type == ON_DEMAND else ""
    job_record_event(
        job=locked,
        kind="acquisition",
        message=f"requested {missing} {kind_label}{plan.provider} node(s) ({reason})",
        data={
            "acquisition": acquisition.pk,
            "count": missing,
            "capacity_type": capacity_type,
            "pools": acquisition.pools,
            "avoided_pools": acquisition.avoided_pools,
        },
        at=now,
    )
    return acquisition


CAPACITY_WAIT_EVENT = "capacity_wait"


def _record_capacity_wait(job: TrainingJob, *, missing: int, unavailable: list[Pool], capacity_type: str) -> None:
    """One timeline event while every offering is out of capacity (not one per reconcile)."""
    ttl = unavailable_ttl()
    if JobEvent.objects.filter(job=job, kind=CAPACITY_WAIT_EVENT, at__gte=_now() - ttl).exists():
        return
    keys = [p.key for p in unavailable]
    job_record_event(
        job=job, kind=CAPACITY_WAIT_EVENT,
        message=f"waiting for {missing} {capacity_type} node(s): no capacity in {', '.join(keys)[:200]}",
        data={"missing": missing, "capacity_type": capacity_type, "unavailable_pools": keys},
    )


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
    return str(tunable("SPOTPIPE_PUBLIC_URL")).rstrip("/")


def acquisition_launch(*, acquisition: Acquisition) -> list[Instance]:
    """Launch the nodes of an acquisition and attach their provider ids to its instances.

    Runs the provider call outside any transaction. If another runner holds the launch, returns
    without calling the provider; if the provider already launched for this token (a retry), it
    returns those nodes and nothing new is started."""
    from controlplane.orchestration.rendezvous import rendezvous_ensure

    acquisition.refresh_from_db()
    if acquisition.status in (AcquisitionStatus.FULFILLED, AcquisitionStatus.FAILED):
        return list(Instance.objects.filter(request_token__startswith=f"{acquisition.request_token}/"))
    if TrainingJob.objects.filter(pk=acquisition.job_id).exclude(status__in=ACTIVE_JOB_STATUSES).exists():
        # Its job ended (and was released) since this was requested, a task still queued runs it
        # now: no nodes, and no rendezvous store started again for nobody.
        Acquisition.objects.filter(pk=acquisition.pk, status=AcquisitionStatus.REQUESTED).update(
            status=AcquisitionStatus.FAILED, error="the job ended before its nodes were launched")
        return []
    # The store first: by the time the nodes enrol, the first generation can name it.
    rendezvous_ensure(job=acquisition.job)
    if not _claim_launch(acquisition):
        return []
    provider = get_provider(acquisition.provider)
    try:
        nodes = _launch_failing_over(acquisition, provider)
        return acquisition_attach(acquisition=acquisition, nodes=nodes)
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


def _launch_request(acquisition: Acquisition, *, token: str, count: int, pools: list[Pool]) -> LaunchRequest:
    return LaunchRequest(
        client_token=token,
        count=count,
        pools=tuple(pools),
        bootstrap=AgentBootstrap(
            control_plane_url=control_plane_url(),
            enroll_key=acquisition_enroll_key(acquisition=acquisition),
            cloud="aws"
            if acquisition.provider == ProviderKind.AWS
            else tunable("SPOTPIPE_LOCAL_METADATA_CLOUD"),
            heartbeat_s=tunable("SPOTPIPE_HEARTBEAT_S"),
        ),
        tags={TAG_JOB: str(acquisition.job_id), TAG_TEAM: str(acquisition.team_id)},
        capacity_type=acquisition.capacity_type or SPOT,
        region=pools[0].region if pools else "",
    )


def _launch_failing_over(acquisition: Acquisition, provider: Any) -> list[NodeInfo]:
    """Launch the acquisition's nodes from its pools, cheapest first; an offering that answers "no
    capacity" is marked unavailable for every team (`offerings`) and the same launch goes on at once
    with the offerings left, keeping what was launched. Returns every node launched (fewer than
    asked when every offering is out).

    Round k of a launch uses the client token `<token>.k` (round 1: the token itself), and each
    failed round is recorded before the next starts: a retried task resumes at the same round, and
    the provider adopts what that round's first try launched instead of launching it again."""
    pools = [Pool(instance_type=p["instance_type"], zone=p.get("zone") or "", region=p.get("region") or "")
             for p in acquisition.pools]
    capacity_type = acquisition.capacity_type or SPOT
    failed_rounds = list(acquisition.failed_pools or [])
    tried = {key for entry in failed_rounds for key in entry.get("pools", [])}
    nodes: list[NodeInfo] = []
    while len(nodes) < acquisition.count:
        state = pool_unavailability(team_id=acquisition.team_id, provider=acquisition.provider,
                                    capacity_type=capacity_type)
        open_pools = [p for p in pools if not state.blocked(p) and p.key not in tried]
        if not open_pools:
            break
        round_number = len(failed_rounds) + 1
        token = acquisition.request_token if round_number == 1 else f"{acquisition.request_token}.{round_number}"
        request = _launch_request(acquisition, token=token, count=acquisition.count - len(nodes), pools=open_pools)
        try:
            nodes += provider.launch(request)
            break
        except InsufficientCapacity as exc:
            named = set(exc.pools)
            failed = [p for p in open_pools if p.key in named] or open_pools
            nodes += exc.nodes
            offerings_mark_no_capacity(provider=acquisition.provider, pools=failed, capacity_type=capacity_type,
                                       code=exc.code or "InsufficientCapacity")
            tried |= {p.key for p in failed}
            failed_rounds.append({"round": round_number, "pools": [p.key for p in failed],
                                  "code": (exc.code or "InsufficientCapacity")[:100],
                                  "launched": len(exc.nodes), "at": _now().isoformat()})
            Acquisition.objects.filter(pk=acquisition.pk).update(failed_pools=failed_rounds)
            logger.info("acquisition %s: no capacity in %s (%s); %d pool(s) left", acquisition.pk,
                        [p.key for p in failed], exc.code, len(pools) - len(tried))
    acquisition.failed_pools = failed_rounds
    return nodes


@transaction.atomic
def acquisition_attach(*, acquisition: Acquisition, nodes: list[NodeInfo]) -> list[Instance]:
    """Give each requested instance of the acquisition a launched node (in order), move it to
    pending, and mark the acquisition fulfilled. Instances left without a node have failed.

    In bulk, under the job's lock: one update of the nodes' ids, one insert of their events, one
    update of their states (`instances_moved_save`), one ending of those left without a node; a
    round of each per node held a 128-node job's lock for 1.4 s (`python -m bench joblocks`)."""
    locked = Acquisition.objects.select_for_update().get(pk=acquisition.pk)
    jobs, instances = lock_jobs_then_instances(
        job_ids=[locked.job_id], instances=Instance.objects.filter(request_token__startswith=f"{locked.request_token}/")
    )
    known = {i.provider_instance_id for i in instances if i.provider_instance_id}
    fresh = [n for n in nodes if n.provider_instance_id not in known]
    at = _now()
    attached: list[Instance] = []
    given: list[Instance] = []  # got a node here
    moved: list[Instance] = []
    events = []
    without_node: list[Instance] = []
    unwanted: list[str] = []
    types: dict[str, Any] = {}
    zones: dict[str, Any] = {}
    for instance in instances:
        if instance.provider_instance_id:
            attached.append(instance)
            continue
        if not fresh:
            without_node.append(instance)
            continue
        node = fresh.pop(0)
        if instance.state in TERMINAL_STATES:
            # Released while the provider launched (its job ended): nothing will ever look at this
            # instance again, so its node is terminated here rather than left running unbilled.
            unwanted.append(node.provider_instance_id)
            continue
        type_name = node.instance_type or "unknown"
        if type_name not in types:
            types[type_name] = _instance_type_row(locked.provider, type_name)
        if node.zone not in zones:
            zones[node.zone] = _zone_row(locked.provider, node.zone)
        instance.provider_instance_id = node.provider_instance_id
        instance.instance_type = types[type_name]
        instance.zone = zones[node.zone]
        instance.agent_address = node.address[:200]
        instance.updated_at = at
        given.append(instance)
        if instance.state != InstanceState.PENDING and InstanceState.PENDING in ALLOWED_TRANSITIONS[instance.state]:
            detail = {"acquisition": locked.pk, "pool": f"{node.instance_type}@{node.zone}"}
            events.append(instance_transition_locked(instance=instance, to=InstanceState.PENDING, at=at, detail=detail))
            moved.append(instance)
        attached.append(instance)
    bulk_update_by_pk(Instance, given, ATTACH_FIELDS)
    instances_moved_save(moved=moved, events=events, at=at)
    short_reason = ("no capacity in any offering" if locked.failed_pools else "provider launched fewer nodes")
    _end_locked_many(without_node, InstanceState.FAILED, detail={"reason": short_reason})
    # Every offering said no capacity and nothing came: failed (the job's next reconcile asks again).
    out_of_capacity = not attached and bool(locked.failed_pools)
    locked.status = AcquisitionStatus.FAILED if out_of_capacity else AcquisitionStatus.FULFILLED
    locked.launched = len(attached)
    locked.fulfilled_at = _now()
    locked.error = "no capacity in any offering" if out_of_capacity else ""
    locked.save(update_fields=["status", "launched", "fulfilled_at", "error"])
    job_record_event(
        job=locked.job,
        kind="acquired",
        message=f"{len(attached)} of {locked.count} node(s) launched",
        data={
            "acquisition": locked.pk,
            "instances": [i.pk for i in attached],
            "provider_ids": [i.provider_instance_id for i in attached],
            "failed_pools": locked.failed_pools,
        },
    )
    if unwanted:
        ended = jobs[locked.job_id].status not in ACTIVE_JOB_STATUSES
        transaction.on_commit(lambda: _end_unwanted(locked, unwanted, release_store=ended))
    return attached


def _end_unwanted(acquisition: Acquisition, node_ids: list[str], *, release_store: bool) -> None:
    """Terminate nodes launched for instances released meanwhile, and the rendezvous store the
    launch started again for a job that had ended (its release ran before and will not run again)."""
    from controlplane.orchestration.rendezvous import rendezvous_release

    logger.warning("acquisition %s: terminating %d node(s) launched after their job's release: %s",
                   acquisition.pk, len(node_ids), node_ids)
    get_provider(acquisition.provider).terminate(node_ids)
    if release_store:
        rendezvous_release(job=acquisition.job)


def job_start(*, job: TrainingJob) -> Acquisition | None:
    """Begin a pending job: request its plan's capacity (launch happens in a task)."""
    return capacity_request(job=job, reason=AcquisitionReason.INITIAL)
