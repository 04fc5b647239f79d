"""Training jobs, their generations (membership + layout epochs), reconfigurations, metrics and
timeline events."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models

from controlplane.common.models import TimeStampedModel
from runtime.config import JOB_STRATEGIES, STRATEGY_LABELS
from runtime.planner.capacity_policy import CAPACITY_POLICIES, CAPACITY_TYPES, DEFAULT_CAPACITY_POLICY, SPOT

# The names are the runtime's (runtime/config.py owns them): AUTO, CHECKPOINT, BAMBOO, RECYCLE, OOBLECK.
Strategy = models.TextChoices("Strategy", [(name.upper(), (name, STRATEGY_LABELS[name])) for name in JOB_STRATEGIES])


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    PENDING = "pending", "Pending"
    PROVISIONING = "provisioning", "Provisioning"
    RUNNING = "running", "Running"
    RECOVERING = "recovering", "Recovering"
    STOPPING = "stopping", "Stopping"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    STOPPED = "stopped", "Stopped"


class EndReason(models.TextChoices):
    """Why a job ended (`TrainingJob.end_reason`): one per way a job can end, so a team can tell a
    budget stop from a crash at a glance. Preemptions are never one: the job recovers from them."""

    FINISHED = "finished", "All its steps are done"
    CANCELLED = "cancelled", "Cancelled"
    BUDGET = "budget", "Stopped at its budget (or its team's monthly budget)"
    MAX_RUNTIME = "max_runtime", "Stopped at its max_runtime_s"
    MAX_WAIT = "max_wait", "Stopped after max_wait_s without enough capacity"
    USER_ERROR = "user_error", "Its code crashed more often than max_restarts_on_errors"
    CONFIG_ERROR = "config_error", "Its configuration or requirements cannot run"
    NO_CHECKPOINT = "no_checkpoint", "Lost state with no checkpoint, replica or replacement to go on from"
    STALLED = "stalled", "Its workers stopped reporting progress"


# A job that holds (or may hold) nodes. `stopping` is active: it writes its checkpoint before it ends.
ACTIVE_JOB_STATUSES = frozenset(
    {JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING, JobStatus.STOPPING}
)

_J = JobStatus
# Which status may follow which (`controlplane.jobs.services.job_set_status` enforces it). An active
# job only moves forward (pending -> provisioning -> running <-> recovering) or ends; it may end from
# any active status (a resumed job may already hold its last step). A limit (budget, max runtime,
# max wait) stops it through `stopping` (a checkpoint, then its nodes go) to `stopped`, or straight
# to `stopped` before it trains; a job giving back borrowed quota goes the same way back to `queued`,
# and a job moving region back to `recovering` (it restarts in the next region). A job over its
# team's quota waits `queued` (at submit, or when resumed) until admitted to pending. Only resume
# leaves an end, back to pending or queued; finished is final.
_ENDS = {_J.FINISHED, _J.FAILED, _J.CANCELLED}
JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    _J.QUEUED: frozenset({_J.PENDING, _J.CANCELLED}),
    _J.PENDING: frozenset({_J.QUEUED, _J.PROVISIONING, _J.RUNNING, _J.RECOVERING, _J.STOPPING, _J.STOPPED, *_ENDS}),
    _J.PROVISIONING: frozenset({_J.QUEUED, _J.RUNNING, _J.RECOVERING, _J.STOPPING, _J.STOPPED, *_ENDS}),
    _J.RUNNING: frozenset({_J.RECOVERING, _J.STOPPING, *_ENDS}),
    _J.RECOVERING: frozenset({_J.RUNNING, _J.STOPPING, *_ENDS}),
    _J.STOPPING: frozenset({_J.STOPPED, _J.QUEUED, _J.RECOVERING, *_ENDS}),
    _J.FINISHED: frozenset(),
    _J.FAILED: frozenset({_J.PENDING, _J.QUEUED}),
    _J.CANCELLED: frozenset({_J.PENDING, _J.QUEUED}),
    _J.STOPPED: frozenset({_J.PENDING, _J.QUEUED}),
}
ENDED_JOB_STATUSES = frozenset({_J.FINISHED, _J.FAILED, _J.CANCELLED, _J.STOPPED})
RESUMABLE_JOB_STATUSES = frozenset({_J.FAILED, _J.CANCELLED, _J.STOPPED})
"""Ended statuses `POST /jobs/{id}/resume/` continues from (finished is final)."""
DEFAULT_PRIORITY = 100
MAX_PRIORITY = 1000
DEFAULT_MAX_RESTARTS_ON_ERRORS = 3


def new_artifacts_key() -> str:
    """A job's own part of its artifact folder's name (`controlplane.jobs.artifacts`)."""
    return secrets.token_hex(4)


class TrainingJob(TimeStampedModel):
    """A training job submitted by a team, with a deadline and/or a budget."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    name = models.CharField(max_length=120)
    config = models.JSONField(
        default=dict, help_text="The runtime's JobConfig (runtime/config.py): model, batch, layout, strategy, seed..."
    )
    strategy = models.CharField(max_length=20, choices=Strategy.choices, default=Strategy.AUTO)
    target_steps = models.PositiveIntegerField()
    deadline = models.DateTimeField(null=True, blank=True)
    budget_usd = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    capacity = models.CharField(
        max_length=30, choices=[(p, p) for p in CAPACITY_POLICIES], default=DEFAULT_CAPACITY_POLICY,
        help_text="How the job's nodes are bought: spot, spot_then_on_demand (on-demand when the deadline needs "
        "it) or on_demand (runtime/planner/capacity_policy.py).")
    capacity_type = models.CharField(
        max_length=20, choices=[(t, t) for t in CAPACITY_TYPES], default=SPOT,
        help_text="What the policy buys now; spot_then_on_demand switches it.")
    deadline_unreachable_at = models.DateTimeField(
        null=True, blank=True, help_text="When the deadline became unreachable even on on-demand (alerted once).")
    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.PENDING)
    status_message = models.CharField(max_length=300, blank=True)
    priority = models.PositiveSmallIntegerField(
        default=DEFAULT_PRIORITY, help_text=f"0-{MAX_PRIORITY}, higher first: the order a team's queue admits jobs in.")
    max_runtime_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Stop (with a checkpoint) after this many seconds of running.")
    max_wait_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Stop after this many seconds in a row without enough capacity.")
    max_restarts_on_errors = models.PositiveIntegerField(
        default=DEFAULT_MAX_RESTARTS_ON_ERRORS,
        help_text="Worker crashes (its code raised, not a preemption) the job survives; the next ends it.")
    queued_at = models.DateTimeField(
        null=True, blank=True, help_text="When it entered its team's queue: first come first served within a priority.")
    stop_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="When a limit asked the job to checkpoint and stop (status stopping).")
    end_reason = models.CharField(max_length=20, choices=EndReason.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True, help_text="The crashed worker's exit code (user_error).")
    end_log = models.TextField(blank=True, help_text="The last lines of the crashed worker's log (user_error).")
    plan = models.JSONField(
        default=dict, blank=True, help_text="controlplane.planning.plans.JobPlan: provider, pools, nodes, dp, pp, ..."
    )
    current_generation = models.PositiveIntegerField(default=0)
    steps_done = models.PositiveIntegerField(default=0)
    samples_done = models.BigIntegerField(default=0)
    initial_loss = models.FloatField(null=True, blank=True)
    last_loss = models.FloatField(null=True, blank=True)
    last_val_loss = models.FloatField(
        null=True, blank=True, help_text="Validation loss of the newest validation pass (config.val_every)."
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    artifacts_key = models.CharField(
        max_length=16, blank=True, default=new_artifacts_key, editable=False,
        help_text="Names the job's artifact folder with its id, so a job whose id an earlier database already "
        "used (a reset, another control plane on the same store) never reads or prunes that job's "
        "checkpoints. Empty for jobs made before it existed: their folder stays job-<id>.")

    class Meta:
        indexes = [models.Index(fields=["team", "status"], name="job_team_status_idx")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(deadline__isnull=False) | models.Q(budget_usd__isnull=False),
                name="job_has_deadline_or_budget",
            ),
            models.CheckConstraint(
                condition=models.Q(budget_usd__isnull=True) | models.Q(budget_usd__gt=0),
                name="job_budget_positive",
            ),
            models.CheckConstraint(condition=models.Q(priority__lte=MAX_PRIORITY), name="job_priority_range"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class JobGeneration(models.Model):
    """One epoch of a job's membership and layout. Agents switch generation at an iteration
    boundary; numbers only grow."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="generations")
    number = models.PositiveIntegerField()
    membership = models.JSONField(
        default=list, help_text="[{instance: id, rank, pipeline, stage}] for every worker of the generation."
    )
    layout = models.JSONField(default=dict, help_text="{dp, pp, stage_layers, micro_batches, reroutes...}")
    reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="generation_job_number_unique")]
        ordering = ["job", "number"]

    def __str__(self) -> str:
        return f"{self.job_id} gen {self.number}"


class ReconfigurationTrigger(models.TextChoices):
    NOTICE = "notice", "Interruption notice"
    DEATH = "death", "Node died without notice"
    JOIN = "join", "Replacement joined"
    MANUAL = "manual", "Manual"


class ReconfigurationStatus(models.TextChoices):
    DECIDED = "decided", "Decided"
    APPLIED = "applied", "Applied"
    FAILED = "failed", "Failed"


class Reconfiguration(models.Model):
    """A decision to change a job's generation, with what triggered it and the decision's input.

    `trigger_key` makes the decision idempotent: a replayed notice or a task that runs twice finds
    the existing row instead of reconfiguring again."""

    # (job, trigger_key)'s unique index serves lookups by job: no single-column index to write.
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="reconfigurations", db_index=False)
    trigger = models.CharField(max_length=20, choices=ReconfigurationTrigger.choices)
    trigger_key = models.CharField(max_length=200)
    strategy = models.CharField(max_length=20, choices=Strategy.choices)
    decision = models.CharField(max_length=40, blank=True, help_text="reroute, takeover, reinstantiate, restart")
    decision_input = models.JSONField(default=dict)
    instance = models.ForeignKey(
        "fleet.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="reconfigurations"
    )
    notice = models.ForeignKey(
        "fleet.InterruptionNotice", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="reconfigurations",
    )
    from_generation = models.PositiveIntegerField(null=True, blank=True)
    to_generation = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(
        max_length=20, choices=ReconfigurationStatus.choices, default=ReconfigurationStatus.DECIDED
    )
    lost_seconds = models.FloatField(default=0, help_text="Training time lost to this event.")
    decided_at = models.DateTimeField()
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "trigger_key"], name="reconfiguration_trigger_unique")
        ]
        ordering = ["decided_at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.trigger} -> {self.decision}"


class MetricSample(models.Model):
    """One training step's metrics as a worker reported it. Millions of rows: indexed by
    (job, step) for progress and (job, at) for time-series charts.

    A validation pass (`config.val_every`) is a row of its own with `val_loss` and no `loss`: the
    runtime reports it apart from the step's training record. Its rows are few (one per node and
    pass), so a partial index on (job, step) finds them without reading the training rows."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metrics")
    generation = models.PositiveIntegerField(default=0)
    instance = models.ForeignKey(
        "fleet.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="metrics"
    )
    step = models.PositiveIntegerField()
    at = models.DateTimeField()
    loss = models.FloatField(null=True, blank=True)
    val_loss = models.FloatField(null=True, blank=True, help_text="Loss on the held-out batches (validation pass).")
    samples_per_s = models.FloatField(null=True, blank=True)
    stage_times = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "step"], name="metric_job_step_idx"),
            models.Index(fields=["job", "at"], name="metric_job_at_idx"),
            models.Index(fields=["job", "step"], name="metric_job_val_step_idx",
                         condition=models.Q(val_loss__isnull=False)),
        ]
        # One training row and one validation row per (job, generation, instance, step): a batch an
        # agent sends again (its POST timed out after the commit) stores nothing twice.
        # `job_record_metrics` skips the repeats; these are the backstop. Rows without an instance
        # (not from an agent) are not deduplicated: NULLs are distinct in a unique index.
        constraints = [
            models.UniqueConstraint(fields=["job", "generation", "instance", "step"], name="metric_train_once",
                                    condition=models.Q(val_loss__isnull=True)),
            models.UniqueConstraint(fields=["job", "generation", "instance", "step"], name="metric_val_once",
                                    condition=models.Q(val_loss__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} step {self.step}"


class JobEvent(models.Model):
    """The job's timeline: submitted, node acquired, notice, preempted, re-routed, joined, finished."""

    # (job, at) serves lookups by job: no single-column index to write on every event.
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events", db_index=False)
    kind = models.CharField(max_length=40)
    message = models.CharField(max_length=300)
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"], name="jobevent_job_at_idx")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}: {self.message}"


class Package(models.Model):
    """A Python package file (wheel or sdist) a team uploaded for its jobs' `requirements`
    (`upload:<sha256>`). The bytes live in the artifact store under their sha256
    (`controlplane/jobs/packages.py`); this row is what makes them the team's."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="packages")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sha256 = models.CharField(max_length=64)
    filename = models.CharField(max_length=200, help_text="The uploaded name: pip reads a wheel's tags from it.")
    size = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "sha256"], name="package_team_sha256_unique")]

    def __str__(self) -> str:
        return f"{self.filename} ({self.sha256[:12]})"


class JobTracker(models.Model):
    """An experiment tracker the control plane forwards a job's metrics to (`tracking` of the job),
    with its run there and how far the forwarding got (`controlplane.jobs.tracking`)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="trackers")
    name = models.CharField(max_length=20, help_text="mlflow or wandb (controlplane.jobs.tracking.TRACKERS).")
    run_id = models.CharField(max_length=100, blank=True, help_text="The run's id in the tracker; empty until opened.")
    run_name = models.CharField(max_length=200, blank=True)
    where = models.CharField(max_length=500, blank=True, help_text="The tracking URI, or W&B's folder.")
    last_step = models.IntegerField(default=0, help_text="Steps done already sent (0: none).")
    ended = models.BooleanField(default=False, help_text="The job ended and its run was closed.")
    error = models.CharField(max_length=500, blank=True, help_text="The last failure to reach the tracker.")
    claimed_until = models.DateTimeField(
        null=True, blank=True, help_text="A forwarding round holds the run until then (one round at a time).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="job_tracker_unique")]
        indexes = [models.Index(fields=["ended"], name="job_tracker_open_idx", condition=models.Q(ended=False))]

    def __str__(self) -> str:
        return f"job {self.job_id} -> {self.name} {self.run_id or '(not opened)'}"


class PrepareShareState(models.TextChoices):
    PENDING = "pending", "Not taken, or its node is gone"
    RUNNING = "running", "A node prepares it"
    DONE = "done", "Its files are tokenized into shards"


class PrepareShare(models.Model):
    """One share of a job's prepare step (`config.data.prepare`, `controlplane.jobs.prepare_step`):
    the node holding it tokenizes share `number` of `of` of the source's files
    (`runtime.data.prepare_share`)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="prepare_shares")
    number = models.PositiveIntegerField()
    of = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=PrepareShareState.choices, default=PrepareShareState.PENDING)
    # The node's id without a foreign key: jobs knows nothing of the fleet's rows; orchestration says
    # which nodes still serve the job when a share is claimed.
    instance_id = models.BigIntegerField(null=True, blank=True, help_text="The node that holds or did the share.")
    index_written = models.BooleanField(default=False, help_text="This share wrote the corpus' index.json.")
    files = models.PositiveIntegerField(default=0)
    input_bytes = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0.0)
    attempts = models.PositiveIntegerField(default=0, help_text="Times a node took it (more than 1: a node was lost).")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="prepare_share_job_number_unique")]
        ordering = ["job", "number"]

    def __str__(self) -> str:
        return f"job {self.job_id} share {self.number}/{self.of} {self.state}"
