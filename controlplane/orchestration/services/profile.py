"""`plan: auto` for a model function sent without its per-layer measures: the job's first node
measures the model where its code and data are (`runtime.train.node_profile`, run by the agent on
the command `profile`), and the job is planned from that profile under the limits it was submitted
with. Until then its plan is one node of the cheapest allowed pool and no generation starts
(`planning.services._profile_first`, `JobPlan.awaiting_profile`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from controlplane.common.errors import Conflict
from controlplane.fleet.models import Instance
from controlplane.jobs.models import EndReason, TrainingJob
from controlplane.jobs.replanning import job_plan_store, plan_from_profile, profiled_contract
from controlplane.jobs.services import job_record_event
from controlplane.orchestration.enqueue import enqueue_on_commit
from controlplane.orchestration.services.generations import job_grow
from controlplane.orchestration.services.job_end import job_fail
from controlplane.orchestration.services.transitions import _lock_job
from controlplane.planning.plans import JobPlan
from runtime.config import LayoutError


def awaits_profile(job: TrainingJob) -> bool:
    """Whether `job` still waits for its first node's profile before it is planned."""
    return JobPlan.from_dict(job.plan).awaiting_profile


def job_profile_received(*, instance: Instance, profile: Mapping[str, Any]) -> TrainingJob:
    """The profile `instance`'s agent measured for its job: plan the job from it and store the plan
    and the profiled contract (the planner's layout, the model's layers and measures), or fail the
    job when no plan meets its deadline or budget. Raises `LayoutError` naming `profile.<field>` for a
    report that is not a profile (nothing is written), `Conflict` when the job does not wait for one."""
    from controlplane.orchestration import tasks

    if instance.job is None:
        raise Conflict(f"instance {instance.pk} serves no job", field="profile")
    with transaction.atomic():
        job = _lock_job(instance.job)
        if not awaits_profile(job):
            raise Conflict(f"job {job.pk} does not wait for a profile (its plan is made)", field="profile")
        contract = profiled_contract(job=job, profile=profile)
        try:
            plan, config = plan_from_profile(job=job, contract=contract)
        except LayoutError as exc:
            job_fail(job=job, reason=f"plan.auto from the first node's profile: {exc}"[:300],
                     end_reason=EndReason.CONFIG_ERROR, data={"instance": instance.pk, "field": exc.field})
            return job
        job_plan_store(job=job, plan=plan, config=config.to_dict())
        pool = plan.pools[0] if plan.pools else None
        job_record_event(
            job=job, kind="planned",
            message=(f"planned from instance {instance.pk}'s profile of the model ({config.model.layers} layers): "
                     f"dp={config.dp} x pp={config.pp} on {plan.nodes} x "
                     f"{pool.instance_type if pool else '?'}")[:300],
            data={"instance": instance.pk, "plan": plan.to_dict()},
        )
        enqueue_on_commit(tasks.reconcile_job, job.pk)
    job_grow(job=job)
    return job


def profile_failed_report(*, instance: Instance, reason: str) -> bool:
    """The first node could not profile its job's model (it does not build, or its data cannot be
    read there): every node would fail the same way, so the job fails with the reason. True when it
    was failed (False: it had ended, or it does not wait for a profile)."""
    if instance.job is None or not awaits_profile(instance.job):
        return False
    return job_fail(job=instance.job, reason=f"the model could not be profiled on the first node: "
                                             f"{reason or 'no reason given'}"[:300],
                    end_reason=EndReason.CONFIG_ERROR, data={"instance": instance.pk})
