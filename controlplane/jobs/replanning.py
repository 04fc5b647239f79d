"""Plans of stored jobs made again: `plan.replan` jobs as prices and preemption rates move
(`job_replan`, beat's `planning.replan_jobs`), and a job that waited for its first node's profile of
its model function (`profiled_contract`, `plan_from_profile`). The planning itself is
`controlplane.planning.services.plan_job`; this module owns the job rows it reads and writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.fleet.locks import lock_job
from controlplane.fleet.models import ProviderKind
from controlplane.jobs.models import TrainingJob
from controlplane.market.local_pool import LOCAL_REGION
from controlplane.market.zones import region_of_zone
from controlplane.planning.plans import JobPlan, PlanAsk, PlanPool
from controlplane.planning.services import plan_job
from runtime.config import LAYOUT_FIELDS, JobConfig, LayoutError, build_job_config, each_error, resolve_strategy
from runtime.models.declaration import DECLARED_FIELDS

REPLAN_GAIN = 0.10
"""A new plan replaces the stored one when it costs at least this fraction less at today's prices
(or the stored one no longer meets the deadline): smaller moves are noise in the prices."""


def job_plan_store(*, job: TrainingJob, plan: JobPlan, config: dict[str, Any]) -> None:
    """Store a new plan and the contract made with it (its layout's one home) on `job` (locked)."""
    job.plan, job.config = plan.to_dict(), config
    job.save(update_fields=["plan", "config", "updated_at"])


def _contract_of(job: TrainingJob) -> dict[str, Any]:
    """The job's contract without what its plan set (the layout and the schedule the planner chose)."""
    planned = {*LAYOUT_FIELDS, "schedule"}
    return {k: v for k, v in job.config.items() if k not in planned}


@transaction.atomic
def job_replan(*, job: TrainingJob, at: datetime | None = None) -> JobPlan | None:
    """Plan a `plan.replan` job again with today's prices and preemption rates; store and return the
    new plan when it is worth a change, else None.

    Before the job has started (no generation, no node) the whole plan may change: layout and
    pools. Once it runs, its dp x pp grid stays (the runtime keeps it for the job's life) and only
    the pools move: replacements come from the new cheapest pool that meets the deadline for the
    steps left. A change is worth it when it costs at least REPLAN_GAIN less than the stored plan
    at today's prices, or the stored plan's pool no longer meets the deadline."""
    from controlplane.jobs.models import JobStatus
    from controlplane.jobs.services import job_record_event

    job = lock_job(job)
    stored = JobPlan.from_dict(job.plan)
    grid = (job.config["dp"], job.config["pp"])  # the layout's one home is the contract
    if not (stored.replan and stored.chosen_by == "planner") or job.status not in (
        JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING,
    ):
        return None
    at = at or timezone.now()
    started = job.current_generation > 0
    steps_left = max(1, job.target_steps - job.steps_done)
    ask = PlanAsk(auto=True, provider=stored.provider, instance_types=sorted({p.instance_type for p in stored.pools}),
                  zones=[], max_nodes=stored.max_nodes, replan=True)
    if ask.provider == ProviderKind.AWS:
        from controlplane.planning.plans import default_instance_types

        ask.instance_types = sorted({*ask.instance_types, *default_instance_types(ask.provider)})
    try:
        fresh, fresh_config = plan_job(
            team_id=job.team_id, contract=_contract_of(job), total_microbatches=None, strategy=job.strategy,
            target_steps=steps_left, deadline=job.deadline, budget_usd=job.budget_usd, ask=ask, at=at,
            capacity=job.capacity,
        )
    except LayoutError:
        return None  # nothing meets the limits any more: the stored plan stays; the job page shows its progress
    options = [fresh.predicted, *fresh.runner_ups]
    if started:  # the grid stays: the best option with the stored dp x pp
        options = [o for o in options if o and (o["dp"], o["pp"]) == grid]
    if not options:
        return None
    best = options[0]
    stored_pool = stored.pools[0] if stored.pools else None
    current = next((o for o in [fresh.predicted, *fresh.runner_ups] if o and stored_pool
                    and (o["instance_type"], o["zone"], o["dp"], o["pp"])
                    == (stored_pool.instance_type, stored_pool.zone, *grid)), None)
    if current is not None and (best["instance_type"], best["zone"]) == (current["instance_type"], current["zone"]):
        return None
    if current is not None and best["cost_usd"] > current["cost_usd"] * (1 - REPLAN_GAIN):
        return None
    region = LOCAL_REGION if stored.provider == ProviderKind.LOCAL else region_of_zone(best["zone"])
    new_pools = [PlanPool(instance_type=best["instance_type"], zone=best["zone"], region=region)]
    if started:
        plan = dataclasses.replace(stored, pools=new_pools, predicted=best, runner_ups=fresh.runner_ups)
        config_dict = job.config
    else:
        plan, config_dict = fresh, fresh_config.to_dict()
        plan.pools = new_pools
        config_dict["steps"] = job.target_steps
    job_plan_store(job=job, plan=plan, config=config_dict)
    was = f"{stored_pool.instance_type}@{stored_pool.zone or '*'}" if stored_pool else "?"
    job_record_event(
        job=job, kind="replanned",
        message=f"re-planned: {was} -> {best['instance_type']}@{best['zone'] or '*'} as "
                f"dp={config_dict['dp']} x pp={config_dict['pp']}"
                + (f" (was ${current['cost_usd']:.2f}, now ${best['cost_usd']:.2f} predicted)" if current else ""),
        data={"from": stored.to_dict(), "to": plan.to_dict(), "started": started}, at=at,
    )
    return plan


def replan_due_jobs(*, at: datetime | None = None) -> list[int]:
    """Re-plan every active job that allows it (beat, `planning.replan_jobs`); the ids it changed."""
    from controlplane.jobs.models import ACTIVE_JOB_STATUSES

    changed = []
    for job in TrainingJob.objects.filter(status__in=ACTIVE_JOB_STATUSES, plan__replan=True).only("pk"):
        if job_replan(job=job, at=at) is not None:
            changed.append(job.pk)
    return changed


PROFILE_FIELDS = ("layers", "layer_measures", "layer_costs", "declared")


def profiled_contract(*, job: TrainingJob, profile: Mapping[str, Any]) -> dict[str, Any]:
    """The job's contract with what its first node measured (`runtime.train.node_profile`): the
    layer count, the per-layer measures, the declared context and vocabulary, and (unless the job set
    its own) the timed layer costs. Raises `LayoutError` naming `profile.<field>` for a report that is
    not one (checked by building the contract, as a submission's measures are)."""
    unknown = sorted(set(profile) - set(PROFILE_FIELDS))
    if unknown:
        raise LayoutError(f"unknown field; expected some of {list(PROFILE_FIELDS)}", field=f"profile.{unknown[0]}")
    declared = profile.get("declared") or {}
    if not isinstance(declared, Mapping) or not set(declared) <= set(DECLARED_FIELDS):
        raise LayoutError(f"expected an object of {', '.join(DECLARED_FIELDS)}", field="profile.declared")
    contract = _contract_of(job)
    model = {**contract.get("model", {}), **declared, "layers": profile.get("layers"),
             "layer_measures": profile.get("layer_measures")}
    contract = {**contract, "model": model}
    if profile.get("layer_costs") is not None and contract.get("layer_costs") is None:
        contract["layer_costs"] = profile["layer_costs"]
    try:
        build_job_config(contract, dp=1, pp=1, microbatches=1, strategy=resolve_strategy(job.strategy),
                         steps=job.target_steps)
    except LayoutError as exc:
        first = each_error(exc)[0]
        raise LayoutError(first.message, field=f"profile.{first.field.removeprefix('model.')}") from None
    return contract


def plan_from_profile(*, job: TrainingJob, contract: dict[str, Any],
                      at: datetime | None = None) -> tuple[JobPlan, JobConfig]:
    """The plan of a job that waited for its first node's profile (`_profile_first`), from
    `profiled_contract`, under the limits it was submitted with: raises `LayoutError` (or
    `PlanInfeasible`) when no plan meets them."""
    stored = JobPlan.from_dict(job.plan)
    ask = PlanAsk(auto=True, provider=stored.provider, instance_types=sorted({p.instance_type for p in stored.pools}),
                  zones=sorted({p.zone for p in stored.pools if p.zone}), regions=list(stored.regions),
                  max_nodes=stored.max_nodes, replan=stored.replan)
    return plan_job(team_id=job.team_id, contract=contract, total_microbatches=None, strategy=job.strategy,
                    target_steps=job.target_steps, deadline=job.deadline, budget_usd=job.budget_usd, ask=ask, at=at,
                    capacity=job.capacity)
