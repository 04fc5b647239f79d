"""Writes on training jobs. One function per state change, each recording the JobEvent that the
job's timeline shows (Zulip's `do_*` pattern)."""

from __future__ import annotations

import math
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.billing.metering import job_meter
from controlplane.common.agent_wake import commands_changed
from controlplane.common.errors import Conflict, DomainError
from controlplane.fleet.locks import lock_job
from controlplane.fleet.models import Instance
from controlplane.jobs.admission import admit_or_queue
from controlplane.jobs.data_checks import check_data
from controlplane.jobs.models import (
    ENDED_JOB_STATUSES,
    JOB_TRANSITIONS,
    MAX_PRIORITY,
    RESUMABLE_JOB_STATUSES,
    EndReason,
    JobEvent,
    JobGeneration,
    JobStatus,
    MetricSample,
    TrainingJob,
)
from controlplane.jobs.packages import unknown_uploads
from controlplane.jobs.store_access import store_access_errors
from controlplane.jobs.tracking import job_trackers_create, job_trackers_reopen, tracking_problems
from controlplane.planning.plans import parse_plan_request
from controlplane.planning.services import plan_job
from runtime.config import JOB_STRATEGIES, LayoutError, alias_field, contract_from_model_spec, each_error
from runtime.planner.capacity_policy import CAPACITY_POLICIES, DEFAULT_CAPACITY_POLICY, ON_DEMAND, SPOT
from runtime.storable import unstorable

MAX_BUDGET_USD = Decimal("9999999999.99")  # what budget_usd (12 digits, 2 decimals) can hold
MAX_METRIC_BATCH = 1000

REQUEUED_EVENT = "requeued"
"""A job that gave back borrowed quota goes back to its queue from its checkpoint (`job_stop`)."""
RESTART_EVENTS = ("resumed", "region_move", REQUEUED_EVENT)
"""Timeline kinds of a restart from a checkpoint (`job_restart_from`): they carry `submitted_init_from`."""
CANCELLABLE = frozenset(s for s, following in JOB_TRANSITIONS.items() if JobStatus.CANCELLED in following)
RESUMABLE = RESUMABLE_JOB_STATUSES
# The end reason an end of this status has when its writer names none.
DEFAULT_END_REASONS = {JobStatus.FINISHED: EndReason.FINISHED, JobStatus.CANCELLED: EndReason.CANCELLED}


class IllegalJobTransition(Conflict):
    """A status change that `JOB_TRANSITIONS` does not allow (409)."""


# --- Validation ------------------------------------------------------------------------------------


def _is_positive_int(value: Any) -> bool:
    # bool is an int in Python, but `"steps": true` is a mistake, not 1 step.
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def job_limit_errors(**limits: Any) -> dict[str, list[str]]:
    """Problems of a job's queue and limit fields (`priority`, `max_runtime_s`, `max_wait_s`,
    `max_restarts_on_errors`), each named; None means the default."""
    errors: dict[str, list[str]] = {}
    for field, value in limits.items():
        if value is None:
            continue
        low, high = (0, MAX_PRIORITY) if field == "priority" else \
            (0, 2**31 - 1) if field == "max_restarts_on_errors" else (1, 2**31 - 1)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            errors[field] = [f"must be an integer from {low} to {high}, got {str(value)[:40]!r}"]
    return errors


def parse_budget(value: Any, *, field: str = "budget_usd") -> tuple[Decimal | None, dict[str, list[str]]]:
    """A budget in USD (cents), or the problem with it under `field`: not a number, not above 0, too large."""
    try:
        budget = Decimal(str(value)).quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError):
        return None, {field: [f"not a number: {str(value)[:40]!r}"]}
    if not budget.is_finite() or budget <= 0:
        return None, {field: [f"must be greater than 0, got {str(value)[:40]}"]}
    if budget > MAX_BUDGET_USD:
        return None, {field: [f"at most {MAX_BUDGET_USD}"]}
    return budget, {}


def _job_input_errors(
    *, name: Any, strategy: Any, target_steps: Any, deadline: Any, budget_usd: Any, capacity: Any = None
) -> tuple[dict[str, list[str]], Decimal | None]:
    errors: dict[str, list[str]] = {}
    if capacity is not None and capacity not in CAPACITY_POLICIES:
        errors["capacity"] = [f"unknown capacity policy {str(capacity)[:60]!r}; expected one of "
                              f"{', '.join(CAPACITY_POLICIES)}"]
    if not isinstance(name, str) or not name.strip():
        errors["name"] = ["must be a non-empty string"]
    elif len(name) > TrainingJob._meta.get_field("name").max_length:
        errors["name"] = [f"at most {TrainingJob._meta.get_field('name').max_length} characters"]
    elif "\x00" in name:
        errors["name"] = ["must not contain NUL characters"]
    if strategy not in JOB_STRATEGIES:
        errors["strategy"] = [f"unknown strategy {strategy!r}; expected one of {', '.join(JOB_STRATEGIES)}"]
    if not _is_positive_int(target_steps):
        errors["target_steps"] = [f"must be a positive integer, got {target_steps!r}"]
    elif target_steps > 2**31 - 1:
        errors["target_steps"] = ["too large"]
    budget: Decimal | None = None
    if budget_usd is not None:
        budget, problems = parse_budget(budget_usd)
        errors.update(problems)
    if deadline is not None:
        if not isinstance(deadline, datetime) or timezone.is_naive(deadline):
            errors["deadline"] = ["must be an aware datetime"]
        elif deadline <= timezone.now():
            errors["deadline"] = [f"must be in the future, got {deadline.isoformat()}"]
    if deadline is None and budget_usd is None:
        errors["non_field_errors"] = ["give a deadline, a budget_usd, or both"]
    return errors, budget


def job_contract(*, config: Any = None, model_spec: Any = None) -> tuple[dict[str, Any], int | None, bool]:
    """The request's contract (JobConfig fields) and the legacy body's micro-batches per step: from
    `config`, or from the documented alias `model_spec` (translated by `runtime.config`). The third
    value says whether the alias was used (errors then name `model_spec.<field>`)."""
    if config is not None and model_spec is not None:
        raise LayoutError("give config or model_spec (its older form), not both", field="model_spec")
    if model_spec is not None:
        contract, total = contract_from_model_spec(model_spec)
        return contract, total, True
    if config is None:
        raise LayoutError("required: the job's config (model, global_batch, ...)", field="config")
    if not isinstance(config, dict):
        raise LayoutError(f"config must be an object, got {type(config).__name__}", field="config")
    return dict(config), None, False


# The runtime's layout fields (runtime.config.LAYOUT_FIELDS) are the request's plan, strategy and steps.
LAYOUT_REQUEST_FIELDS = {"dp": "plan.dp", "pp": "plan.pp", "microbatches": "plan.microbatches",
                         "strategy": "strategy", "steps": "target_steps"}


def _request_field(field: str, *, alias: bool) -> str:
    """The request field a contract problem is about: `model_spec.<old name>` for a request in the
    alias form, else `config.<field>` for the contract's own fields."""
    field = field or "config"
    if field in LAYOUT_REQUEST_FIELDS:  # the layout is the plan's, whichever form the contract came in
        return LAYOUT_REQUEST_FIELDS[field]
    if alias:
        return alias_field(field.removeprefix("config."))
    if field.startswith(("plan", "config", "deadline", "budget_usd", "model_spec")):
        return field
    return f"config.{field}"


# --- Jobs ------------------------------------------------------------------------------------------


def job_submit(
    *,
    team: Any,
    user: Any | None,
    name: str,
    strategy: str,
    target_steps: int,
    config: dict[str, Any] | None = None,
    model_spec: dict[str, Any] | None = None,
    plan: dict[str, Any] | str | None = None,
    deadline: datetime | None = None,
    budget_usd: Decimal | float | str | None = None,
    capacity: str | None = None,
    priority: int | None = None,
    max_runtime_s: int | None = None,
    max_wait_s: int | None = None,
    max_restarts_on_errors: int | None = None,
    allow_over_budget: bool = False,
    tracking: list[str] | None = None,
) -> TrainingJob:
    """Validate and store a new job (status pending) with its contract and plan, and its `submitted`
    event. The contract is validated by building the runtime's `JobConfig` with the plan's layout,
    so a job the runtime would reject is refused here (400) under the name of the field to change
    (`config.model.n_head`, `plan.pp`, `model_spec.heads`, `deadline`, ...), and no node is bought.

    `config`: the runtime's JobConfig fields other than the layout (model, global_batch, seed, lr,
    schedule, device_time, ...); `model_spec`: its older form. `plan`: None (one node), `"auto"`
    (the planner picks the cheapest plan that meets the deadline, or the fastest within the budget)
    or an explicit `{dp, pp, nodes, microbatches, provider, instance_types, zones, regions}`. `capacity`: how
    the nodes are bought (`runtime.planner.capacity_policy.CAPACITY_POLICIES`, default spot).
    `priority` orders its team's queue; `max_runtime_s`, `max_wait_s` and `max_restarts_on_errors`
    are its limits (None: the model's defaults). A job its team's quota has no room for is stored
    `queued` (`admission.admit_or_queue`). An explicit plan estimated above the budget is refused
    (422 `PlanInfeasible`) unless `allow_over_budget`. `tracking`: experiment trackers the control
    plane forwards the job's metrics to (`controlplane.jobs.tracking`), each configured here.

    The job's data (`config.data`) is then checked as far as the control plane can
    (`data_checks.check_data`: an s3 source or tokenizer must be there for its AWS credentials),
    before any write and outside the transaction, since that asks S3 over the network; what it did
    not check, and why, goes with the `submitted` event (`data_checks`)."""
    errors, budget = _job_input_errors(
        name=name, strategy=strategy, target_steps=target_steps, deadline=deadline, budget_usd=budget_usd,
        capacity=capacity,
    )
    limits = {"priority": priority, "max_runtime_s": max_runtime_s, "max_wait_s": max_wait_s,
              "max_restarts_on_errors": max_restarts_on_errors}
    errors.update(job_limit_errors(**limits))
    tracking = tracking if tracking is not None else []
    if problems := tracking_problems(tracking):
        errors["tracking"] = problems
    limits = {k: v for k, v in limits.items() if v is not None}
    capacity = capacity or DEFAULT_CAPACITY_POLICY
    job_plan = runtime_config = None
    if not errors:
        alias = model_spec is not None
        try:
            contract, total, alias = job_contract(config=config, model_spec=model_spec)
            ask = parse_plan_request(plan)
            job_plan, runtime_config = plan_job(
                team_id=team.pk, contract=contract, total_microbatches=total, strategy=strategy,
                target_steps=target_steps, deadline=deadline, budget_usd=budget, ask=ask, capacity=capacity,
                allow_over_budget=allow_over_budget,
            )
        except LayoutError as exc:
            for problem in each_error(exc):
                errors.setdefault(_request_field(problem.field, alias=alias), []).append(problem.message)
    if errors:
        raise ValidationError(errors)
    assert job_plan is not None and runtime_config is not None
    unknown = unknown_uploads(team=team, requirements=runtime_config.requirements)
    if unknown:
        raise ValidationError({f"config.requirements[{i}]": [
            f"no package {sha} among your team's uploads; upload it first (POST /api/v1/packages/)"]
            for i, sha in unknown.items()})
    # Before the data check: what it would ask the store must not tell of other teams' folders.
    if store_errors := store_access_errors(runtime_config, team=team):
        raise ValidationError(store_errors)
    data_check = check_data(runtime_config.data)
    if data_check.errors:
        raise ValidationError(data_check.errors)
    with transaction.atomic():
        job = TrainingJob.objects.create(
            team=team, created_by=user, name=name.strip(), config=runtime_config.to_dict(), strategy=strategy,
            plan=job_plan.to_dict(), target_steps=target_steps, deadline=deadline, budget_usd=budget,
            capacity=capacity, capacity_type=ON_DEMAND if capacity == ON_DEMAND else SPOT, status=JobStatus.PENDING,
            **limits,
        )
        job_record_event(
            job=job, kind="submitted", message=f"submitted by {user or 'the system'}",
            data={"strategy": strategy, "target_steps": target_steps,
                  "deadline": deadline.isoformat() if deadline else None,
                  "budget_usd": str(budget) if budget is not None else None, "capacity": capacity,
                  "plan": {"chosen_by": job_plan.chosen_by, "provider": job_plan.provider, "nodes": job_plan.nodes,
                           "dp": runtime_config.dp, "pp": runtime_config.pp},
                  **limits, **({"data_checks": data_check.notes} if data_check.notes else {}),
                  **({"tracking": tracking} if tracking else {})},
        )
        job_trackers_create(job=job, names=tracking)
        admitted, why = admit_or_queue(job)
        if admitted == JobStatus.QUEUED:
            job_set_status(job, JobStatus.QUEUED, f"queued: {why}", kind="queued")
    return job


def _lock(job: TrainingJob) -> TrainingJob:
    return lock_job(job)


def _sync(job: TrainingJob, locked: TrainingJob, fields: list[str]) -> None:
    for field in fields:
        setattr(job, field, getattr(locked, field))


@transaction.atomic
def job_cancel(*, job: TrainingJob, user: Any | None = None, reason: str = "") -> TrainingJob:
    """Cancel an active job. A finished, failed or already cancelled job answers Conflict (409)."""
    if what := unstorable(reason):
        raise DomainError(f"reason contains {what}", field="reason")
    locked = _lock(job)
    if locked.status not in CANCELLABLE:
        raise Conflict(
            f"job is {locked.status!r}; cancel is allowed only from: {', '.join(sorted(CANCELLABLE))}",
            field="status",
        )
    job_set_status(locked, JobStatus.CANCELLED, reason or f"cancelled by {user or 'the system'}",
                   kind="cancelled", data={"by": getattr(user, "pk", None)})
    _sync(job, locked, ["status", "status_message", "finished_at", "updated_at"])
    return job


@transaction.atomic
def job_resume(*, job: TrainingJob, user: Any | None = None, budget_usd: Any = None) -> TrainingJob:
    """Put a stopped, failed or cancelled job back to pending (queued when its team's quota has no
    room), so it is acquired and started again. Its nodes and their state are gone, so it continues
    from its newest complete checkpoint (its config's `init_from` names that folder and its progress
    goes back to that step), or from step 0, from what it was submitted with, when it has none; the
    `resumed` event says which. `budget_usd` is the job's new total budget: above what it has spent
    (409 otherwise), and required to resume a job its budget stopped. Any other status answers
    Conflict (409)."""
    from controlplane.jobs.artifacts import job_latest_checkpoint

    budget = None
    if budget_usd is not None:
        budget, problems = parse_budget(budget_usd)
        if problems:
            raise ValidationError(problems)
    # Listed before the lock: the store may be S3.
    checkpoint = job_latest_checkpoint(job=job)
    locked = _lock(job)
    if locked.status not in RESUMABLE:
        raise Conflict(
            f"job is {locked.status!r}; resume is allowed only from: {', '.join(sorted(RESUMABLE))}",
            field="status",
        )
    spent = job_meter(job_id=locked.pk, at=timezone.now()).spent_usd
    if budget is not None and budget <= spent:
        raise Conflict(f"budget_usd ${budget} is not above the ${spent:.2f} the job has spent; give a larger "
                       "total budget", field="budget_usd")
    if budget is None and locked.end_reason == EndReason.BUDGET and locked.budget_usd is not None \
            and spent >= locked.budget_usd * Decimal("0.99"):
        raise Conflict(f"the job stopped at its ${locked.budget_usd} budget (${spent:.2f} spent); resume with a "
                       "larger total budget_usd", field="budget_usd")
    if locked.deadline is not None and locked.deadline <= timezone.now() and locked.budget_usd is None \
            and budget is None:
        raise Conflict("the job's deadline has passed and it has no budget; submit a new job", field="deadline")
    if budget is not None:
        locked.budget_usd = budget
        locked.save(update_fields=["budget_usd", "updated_at"])
    submitted_init = job_restart_from(locked, checkpoint=checkpoint)
    if checkpoint is not None:
        message = f"resumed by {user or 'the system'} from the checkpoint of step {checkpoint}"
    else:
        message = f"resumed by {user or 'the system'} from step 0: the job has no complete checkpoint"
    job_set_status(locked, JobStatus.PENDING, message, kind="resumed",
                   data={"by": getattr(user, "pk", None), "from_step": checkpoint or 0,
                         "from_checkpoint": checkpoint is not None, "submitted_init_from": submitted_init,
                         **({"budget_usd": str(budget)} if budget is not None else {})})
    admitted, why = admit_or_queue(locked)
    if admitted == JobStatus.QUEUED:
        job_set_status(locked, JobStatus.QUEUED, f"queued: {why}", kind="queued")
    job_trackers_reopen(job=locked)
    _sync(job, locked, ["status", "status_message", "finished_at", "updated_at", "config", "steps_done",
                        "budget_usd", "end_reason", "exit_code", "end_log", "stop_requested_at", "queued_at"])
    return job


def job_restart_from(locked: TrainingJob, *, checkpoint: int | None) -> str:
    """Point the locked job's next start at the checkpoint of step `checkpoint` (its config's
    `init_from`, its progress back to that step), or, with None, at what it was submitted to start
    from, at step 0. Returns that submitted start (the first `resumed` event records it: a restart
    may since have pointed `init_from` at the job's own checkpoints): the caller records it in its
    event, of one of `RESTART_EVENTS`."""
    from controlplane.jobs.artifacts import job_checkpoint_location

    config = dict(locked.config)
    first = locked.events.filter(kind__in=RESTART_EVENTS).order_by("at", "id").first()
    submitted_init = first.data.get("submitted_init_from", "") if first else config.get("init_from", "")
    config["init_from"] = job_checkpoint_location(job=locked, step=checkpoint) if checkpoint is not None \
        else submitted_init
    if not config["init_from"]:
        config.pop("init_from")
    locked.config = config
    locked.steps_done = checkpoint or 0
    locked.save(update_fields=["config", "steps_done", "updated_at"])
    return submitted_init


def job_set_status(job: TrainingJob, status: str, message: str, *, kind: str = "",
                   data: dict[str, Any] | None = None, end_reason: str = "") -> bool:
    """The one writer of a job's status (the caller holds the job's row lock): moves it if
    `JOB_TRANSITIONS` allows, stamps `finished_at` and `end_reason` when it ends (`end_reason`, else
    the status's own: finished, cancelled; all cleared when resumed) and puts the move on the
    timeline (`kind`, default `job_<status>`). False when it is there already; an illegal move raises
    `IllegalJobTransition` and writes nothing."""
    previous = job.status
    if previous == status:
        return False
    if status not in JOB_TRANSITIONS[previous]:
        allowed = ", ".join(sorted(JOB_TRANSITIONS[previous])) or "none: it is final"
        raise IllegalJobTransition(f"job is {previous!r} and cannot become {status!r} (allowed: {allowed})",
                                   field="status")
    job.status = status
    job.status_message = message[:300]
    fields = ["status", "status_message", "updated_at"]
    if status == JobStatus.QUEUED:
        job.queued_at = timezone.now()
        fields.append("queued_at")
    if status in ENDED_JOB_STATUSES:
        if job.finished_at is None:
            job.finished_at = timezone.now()
            fields.append("finished_at")
        job.end_reason = end_reason or DEFAULT_END_REASONS.get(status, "")
        fields.append("end_reason")
    elif previous in ENDED_JOB_STATUSES:  # resumed: what ended it is history (its timeline keeps it)
        job.finished_at, job.end_reason, job.exit_code, job.end_log, job.stop_requested_at = None, "", None, "", None
        fields += ["finished_at", "end_reason", "exit_code", "end_log", "stop_requested_at"]
    job.save(update_fields=fields)
    commands_changed(job_ids=[job.pk])
    event_data = {"from": previous, **(data or {})}
    if status in ENDED_JOB_STATUSES and job.end_reason:
        event_data["end_reason"] = job.end_reason
    job_record_event(job=job, kind=kind or f"job_{status}", message=message, data=event_data)
    return True


def job_record_event(
    *, job: TrainingJob, kind: str, message: str, data: dict[str, Any] | None = None, at: datetime | None = None
) -> JobEvent:
    """Append one event to the job's timeline (message cut to the column's 300 characters)."""
    return JobEvent.objects.create(
        job=job, kind=kind[:40], message=message[:300], data=data or {}, at=at or timezone.now()
    )


# --- Metrics ---------------------------------------------------------------------------------------


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _sample_errors(index: int, sample: Any, instance_ids: set[int]) -> dict[str, list[str]]:
    at = f"samples[{index}]"
    if not isinstance(sample, dict):
        return {at: ["expected an object"]}
    errors: dict[str, list[str]] = {}
    step = sample.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or step > 2**31 - 1:
        errors[f"{at}.step"] = [f"must be a non-negative integer, got {step!r}"]
    for name in ("loss", "val_loss", "samples_per_s"):
        value = sample.get(name)
        if value is not None and not _finite(value):
            errors[f"{at}.{name}"] = [f"must be a finite number, got {value!r}"]
    if _finite(sample.get("samples_per_s")) and sample["samples_per_s"] < 0:
        errors[f"{at}.samples_per_s"] = ["must not be negative"]
    when = sample.get("at")
    if when is not None and (not isinstance(when, datetime) or timezone.is_naive(when)):
        errors[f"{at}.at"] = ["must be an aware datetime"]
    generation = sample.get("generation")
    if generation is not None and (not isinstance(generation, int) or isinstance(generation, bool) or generation < 0):
        errors[f"{at}.generation"] = [f"must be a non-negative integer, got {generation!r}"]
    stage_times = sample.get("stage_times", {})
    if not isinstance(stage_times, dict) or not all(
        isinstance(k, str) and _finite(v) and v >= 0 for k, v in stage_times.items()
    ):
        errors[f"{at}.stage_times"] = ["must map stage names to non-negative seconds"]
    instance = sample.get("instance")
    if instance is not None and instance not in instance_ids:
        errors[f"{at}.instance"] = [f"instance {instance!r} is not an instance of this job's team"]
    unknown = set(sample) - {"step", "loss", "val_loss", "samples_per_s", "at", "generation", "stage_times", "instance"}
    if unknown:
        errors[at] = [f"unknown fields: {', '.join(sorted(unknown))}"]
    return errors


@transaction.atomic
def job_record_metrics(*, job: TrainingJob, samples: list[dict[str, Any]]) -> list[MetricSample]:
    """Store a batch of metric samples and move the job's progress forward, all or nothing.

    Each sample: `step` (required), `loss`, `val_loss`, `samples_per_s`, `at` (default now),
    `generation` (default the job's current one), `stage_times` ({stage: seconds}), `instance` (id).
    A validation pass comes as samples with `val_loss` and no `loss` (the step is the last completed
    one, as for training samples): they move `last_val_loss`, never `last_loss`/`initial_loss`.
    Progress only grows: a late batch of old steps is stored but does not rewind `steps_done`,
    `last_loss` or `last_val_loss`.
    """
    if not isinstance(samples, list) or not samples:
        raise ValidationError({"samples": ["expected a non-empty list of samples"]})
    if len(samples) > MAX_METRIC_BATCH:
        raise ValidationError({"samples": [f"at most {MAX_METRIC_BATCH} samples per batch, got {len(samples)}"]})
    named = {s.get("instance") for s in samples if isinstance(s, dict) and s.get("instance") is not None}
    valid_instances = set(
        Instance.objects.filter(team_id=job.team_id, pk__in=[i for i in named if isinstance(i, int)])
        .values_list("pk", flat=True)
    )
    errors: dict[str, list[str]] = {}
    for index, sample in enumerate(samples):
        errors.update(_sample_errors(index, sample, valid_instances))
    if errors:
        raise ValidationError(errors)

    # Lock the job first: concurrent batches of one job then update progress one after another.
    locked = _lock(job)
    now = timezone.now()
    rows = [
        MetricSample(
            job_id=locked.pk, step=s["step"], at=s.get("at") or now, loss=s.get("loss"), val_loss=s.get("val_loss"),
            samples_per_s=s.get("samples_per_s"), stage_times=s.get("stage_times") or {},
            generation=s["generation"] if s.get("generation") is not None else locked.current_generation,
            instance_id=s.get("instance"),
        )
        for s in samples
    ]
    created = MetricSample.objects.bulk_create(_new_samples(locked, rows), batch_size=500)

    fields = ["updated_at"]
    newest = max(rows, key=lambda r: (r.step, r.at))
    if newest.step > locked.steps_done:
        locked.steps_done = newest.step
        global_batch = (locked.config or {}).get("global_batch") or 0
        locked.samples_done = max(locked.samples_done, newest.step * int(global_batch))
        fields += ["steps_done", "samples_done"]
    with_loss = [r for r in rows if r.loss is not None]
    if with_loss:
        latest = max(with_loss, key=lambda r: (r.step, r.at))
        if latest.step >= locked.steps_done:
            locked.last_loss = latest.loss
            fields.append("last_loss")
        if locked.initial_loss is None:
            locked.initial_loss = min(with_loss, key=lambda r: (r.step, r.at)).loss
            fields.append("initial_loss")
    with_val = [r for r in rows if r.val_loss is not None]
    if with_val:
        # Every node reports the same pass: the newest step wins, unless a pass of a later step is
        # stored already (a late batch; the partial index on validation rows answers this).
        latest = max(with_val, key=lambda r: (r.step, r.at))
        later = MetricSample.objects.filter(job_id=locked.pk, val_loss__isnull=False, step__gt=latest.step)
        if not later.exists():
            locked.last_val_loss = latest.val_loss
            fields.append("last_val_loss")
    if locked.started_at is None:
        locked.started_at = min(r.at for r in rows)
        fields.append("started_at")
    locked.save(update_fields=fields)
    _sync(job, locked, fields)
    return created


def _sample_key(row: MetricSample) -> tuple[int, int | None, int, bool]:
    """What makes a sample unique (the model's `metric_*_once` constraints)."""
    return row.generation, row.instance_id, row.step, row.val_loss is not None


def _new_samples(job: TrainingJob, rows: list[MetricSample]) -> list[MetricSample]:
    """The rows not stored yet: a batch sent again (an agent retrying a POST whose answer it lost)
    or repeating itself stores each sample once. The caller holds the job's lock, so no concurrent
    batch of this job inserts between this read and the insert. Rows without an instance are kept."""
    stored = {
        (g, i, s, v is not None)
        for g, i, s, v in MetricSample.objects.filter(job=job, step__in={r.step for r in rows}, instance__isnull=False)
        .values_list("generation", "instance_id", "step", "val_loss")
    }
    fresh = []
    for row in rows:
        key = _sample_key(row)
        if row.instance_id is None or key not in stored:
            fresh.append(row)
            if row.instance_id is not None:
                stored.add(key)
    return fresh


# --- Generations -----------------------------------------------------------------------------------


def _membership_errors(membership: Any) -> dict[str, list[str]]:
    if not isinstance(membership, list):
        return {"membership": ["expected a list of {instance, rank, ...} objects"]}
    errors: dict[str, list[str]] = {}
    ranks: set[int] = set()
    for index, member in enumerate(membership):
        at = f"membership[{index}]"
        if not isinstance(member, dict):
            errors[at] = ["expected an object"]
            continue
        for key in ("instance", "rank"):
            value = member.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "instance" else 0):
                errors[f"{at}.{key}"] = [f"must be a {'positive' if key == 'instance' else 'non-negative'} integer"]
        if isinstance(member.get("rank"), int):
            if member["rank"] in ranks:
                errors[f"{at}.rank"] = [f"rank {member['rank']} appears twice"]
            ranks.add(member["rank"])
    return errors


@transaction.atomic
def job_generation_publish(
    *, job: TrainingJob, membership: list[dict[str, Any]], layout: dict[str, Any], reason: str = "",
    at: datetime | None = None,
) -> JobGeneration:
    """Publish the job's next generation (membership + layout) and make it current.

    The job row is locked, so concurrent publishers get consecutive numbers; publishing the same
    membership and layout as the current generation again returns it instead of a new one (a
    retried task reconfigures once)."""
    errors = _membership_errors(membership)
    if not isinstance(layout, dict):
        errors["layout"] = ["expected an object"]
    if errors:
        raise ValidationError(errors)
    locked = _lock(job)
    latest = JobGeneration.objects.filter(job_id=locked.pk).order_by("-number").first()
    if latest is not None and latest.number == locked.current_generation and (
        latest.membership == membership and latest.layout == layout
    ):
        return latest
    number = max(locked.current_generation, latest.number if latest else 0) + 1
    at = at or timezone.now()
    generation = JobGeneration.objects.create(
        job_id=locked.pk, number=number, membership=membership, layout=layout, reason=reason[:200], created_at=at
    )
    locked.current_generation = number
    locked.save(update_fields=["current_generation", "updated_at"])
    commands_changed(job_ids=[locked.pk])
    _sync(job, locked, ["current_generation", "updated_at"])
    job_record_event(
        job=locked, kind="generation", message=f"generation {number}: {len(membership)} workers"
        + (f" ({reason})" if reason else ""),
        data={"number": number, "workers": len(membership), "reason": reason}, at=at,
    )
    return generation
