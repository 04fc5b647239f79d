"""Region moves: a job's nodes stay in one region, and when that region cannot give the job the
capacity it is missing within its patience (`SPOTPIPE_REGION_PATIENCE_S`) while another of its
regions can, the job moves: the nodes it still has write a checkpoint of the step they reached
(the job is `stopping` meanwhile, as at a budget stop) and are released, it restarts from that
checkpoint (`jobs.services.job_restart_from`, as a resume does; from its newest complete one when
the write does not complete within `SPOTPIPE_STOP_CHECKPOINT_WAIT_S`, or when no node runs), and
its next acquisition goes to the cheapest region with capacity. The move is a `region_move` event with its cost: the
steps since the checkpoint, redone, and what they cost at the plan's size.

A job that has trained but has no complete checkpoint does not move (it would lose all its work):
its timeline says so once (`region_move_blocked`)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction

from controlplane.fleet.locks import lock_jobs_then_instances
from controlplane.fleet.models import Instance
from controlplane.fleet.states import LIVE_STATES, InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, JobEvent, JobStatus, TrainingJob
from controlplane.jobs.services import job_record_event, job_restart_from
from controlplane.market.zones import pool_region
from controlplane.orchestration.providers import get_provider
from controlplane.orchestration.selectors import job_counted_count, pools_ranked
from controlplane.orchestration.services.acquisition import CAPACITY_WAIT_EVENT, job_capacity_type, job_region
from controlplane.orchestration.services.capacity_policy import work_estimate
from controlplane.orchestration.services.job_stop import TRAINING, job_request_stop
from controlplane.orchestration.services.transitions import _end_locked_many, _job_set_status, _now
from controlplane.planning.plans import JobPlan
from controlplane.tunables import tunable

logger = logging.getLogger(__name__)

REGION_MOVE_EVENT = "region_move"
BLOCKED_EVENT = "region_move_blocked"
# What a wait for capacity counts from: the newest of these ends the previous wait.
WAIT_RESETS = ("acquired", REGION_MOVE_EVENT, "resumed")


def waiting_since(job: TrainingJob) -> datetime | None:
    """When the job began waiting for capacity in its region (its first `capacity_wait` since it last
    got nodes, moved or resumed), or None when it is not waiting."""
    reset = JobEvent.objects.filter(job=job, kind__in=WAIT_RESETS).order_by("-at").values_list("at", flat=True).first()
    waits = JobEvent.objects.filter(job=job, kind=CAPACITY_WAIT_EVENT)
    if reset is not None:
        waits = waits.filter(at__gt=reset)
    return waits.order_by("at").values_list("at", flat=True).first()


def job_region_review(*, job: TrainingJob, now: datetime | None = None) -> str | None:
    """Move the job to another of its regions when its own has given no capacity for its missing
    nodes for longer than its patience and another has some. Returns the region it moves to."""
    from controlplane.jobs.artifacts import job_latest_checkpoint

    now = now or _now()
    if job.status not in ACTIVE_JOB_STATUSES:
        return None
    region = job_region(job)
    if region is None:
        return None
    plan = JobPlan.from_dict(job.plan)
    capacity_type = job_capacity_type(job)
    if job_counted_count(job=job, lifecycle=capacity_type) >= plan.nodes:
        return None
    if pools_ranked(job=job, plan=plan, capacity_type=capacity_type, region=region).usable:
        return None
    since = waiting_since(job)
    if since is None or now - since < timedelta(seconds=float(tunable("SPOTPIPE_REGION_PATIENCE_S"))):
        return None
    elsewhere = [p for p in pools_ranked(job=job, plan=plan, capacity_type=capacity_type).usable
                 if pool_region(plan.provider, p.zone, p.region) != region]
    if not elsewhere:
        return None
    target = pool_region(plan.provider, elsewhere[0].zone, elsewhere[0].region)
    checkpoint = job_latest_checkpoint(job=job)
    if checkpoint is None and job.steps_done > 0:
        if not JobEvent.objects.filter(job=job, kind=BLOCKED_EVENT, at__gt=since).exists():
            job_record_event(job=job, kind=BLOCKED_EVENT, message=(
                f"{region} has had no capacity for {(now - since).total_seconds():.0f} s and {target} has some, "
                f"but the job has no complete checkpoint to move with: it waits in {region}"),
                data={"from": region, "to": target})
        return None
    price = elsewhere[0].price
    # The nodes it still has first write a checkpoint of the step they reached (the stop path:
    # `job_stop.job_stop_progress` calls `region_move_after_checkpoint`), so the move redoes nothing.
    if job.status in TRAINING and job.current_generation and Instance.objects.filter(
            job=job, state=InstanceState.RUNNING).exists() and job_request_stop(
            job=job, end_reason="", message=f"moving from {region} to {target}: {region} has had no capacity for "
            f"{(now - since).total_seconds():.0f} s",
            move={"from": region, "to": target, "usd_per_hour": None if price is None else str(price)}, now=now):
        return target
    _move(job, region=region, target=target, checkpoint=checkpoint, price=price, now=now)
    return target


def region_move_after_checkpoint(*, job: TrainingJob, move: dict[str, Any], checkpoint: int | None,
                                 now: datetime | None = None) -> None:
    """The move a stopping job asked for, once its nodes' checkpoint is complete (or the wait for it
    ran out: then from its newest complete checkpoint)."""
    price = move.get("usd_per_hour")
    _move(job, region=str(move["from"]), target=str(move["to"]), checkpoint=checkpoint,
          price=Decimal(price) if price is not None else None, now=now or _now())


def _move_cost(job: TrainingJob, *, checkpoint: int | None, nodes: int, price: Decimal | None,
               now: datetime) -> dict[str, Any]:
    """What moving costs: the steps since the checkpoint are trained again, at the plan's size and
    the target pool's price."""
    redone = max(0, job.steps_done - (checkpoint or 0))
    estimate = work_estimate(job=job, now=now)
    step_s = estimate.step_s if estimate is not None else None
    seconds = redone * step_s if step_s is not None else None
    usd = (Decimal(str(seconds)) / 3600 * nodes * price).quantize(Decimal("0.0001")) \
        if seconds is not None and price is not None else None
    return {"steps_redone": redone, "seconds_redone": round(seconds, 1) if seconds is not None else None,
            "usd_redone": str(usd) if usd is not None else None}


def _move(job: TrainingJob, *, region: str, target: str, checkpoint: int | None, price: Decimal | None,
          now: datetime) -> None:
    from controlplane.orchestration.rendezvous import rendezvous_release

    live = list(Instance.objects.filter(job=job, state__in=LIVE_STATES))
    plan = JobPlan.from_dict(job.plan)
    cost = _move_cost(job, checkpoint=checkpoint, nodes=plan.nodes, price=price, now=now)
    ids = [i.provider_instance_id for i in live if i.provider_instance_id]
    if ids:
        get_provider(plan.provider).terminate(ids)
    reason = f"region move from {region} to {target}"
    with transaction.atomic():
        jobs, locked = lock_jobs_then_instances(job_ids=[job.pk], instances=Instance.objects.filter(
            pk__in=[i.pk for i in live]))
        locked_job = jobs[job.pk]
        if locked_job.status not in ACTIVE_JOB_STATUSES:
            return
        if locked_job.stop_requested_at is not None:  # the checkpoint the move asked for is written
            locked_job.stop_requested_at, locked_job.end_reason = None, ""
            locked_job.save(update_fields=["stop_requested_at", "end_reason", "updated_at"])
        # Ended as ours, not lost: no reaction (the whole generation goes) and no pool cool-down.
        _end_locked_many([i for i in locked if i.state != InstanceState.TERMINATED], InstanceState.TERMINATED,
                         detail={"reason": reason})
        submitted_init = job_restart_from(locked_job, checkpoint=checkpoint)
        step = checkpoint or 0
        job_record_event(job=locked_job, kind=REGION_MOVE_EVENT, at=now, message=(
            f"moved from {region} to {target} after waiting for capacity: restarting from step {step}; "
            f"{cost['steps_redone']} step(s) redone"),
            data={"from": region, "to": target, "released": [i.pk for i in locked], "from_step": step,
                  "from_checkpoint": checkpoint is not None, "submitted_init_from": submitted_init, **cost})
        if locked_job.status != JobStatus.PENDING:
            _job_set_status(locked_job, JobStatus.RECOVERING, f"moving to {target}: {region} has no capacity")
    # The workers' store holds the old generation: the job starts afresh with a new one.
    rendezvous_release(job=job)
    logger.info("job %s: %s (from step %s)", job.pk, reason, checkpoint)
