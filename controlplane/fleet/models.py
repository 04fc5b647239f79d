"""Instances (spot VMs or local node processes), their event log, and interruption notices."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TimeStampedModel
from controlplane.fleet.states import TERMINAL_STATES, InstanceState


class ProviderKind(models.TextChoices):
    LOCAL = "local", "Local processes"
    AWS = "aws", "Amazon EC2"


class Lifecycle(models.TextChoices):
    SPOT = "spot", "Spot"
    ON_DEMAND = "on_demand", "On-demand"


class Instance(TimeStampedModel):
    """One VM (or local node) from request to end. `state` changes only through
    `fleet.services.instance_transition`, which enforces the state machine and logs an event."""

    # No single-column indexes on team and job: (team, state) and (job, state) serve those lookups,
    # and every state change (not a HOT update: state is indexed) writes an entry in each index.
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="instances", db_index=False)
    job = models.ForeignKey(
        "jobs.TrainingJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="instances",
        db_index=False,
    )
    provider = models.CharField(max_length=20, choices=ProviderKind.choices, default=ProviderKind.LOCAL)
    # Null (not "") until the provider assigns an id, so the unique constraint ignores it.
    provider_instance_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    instance_type = models.ForeignKey("market.InstanceType", on_delete=models.PROTECT, related_name="instances")
    zone = models.ForeignKey(
        "market.Zone", null=True, blank=True, on_delete=models.PROTECT, related_name="instances"
    )
    lifecycle = models.CharField(max_length=20, choices=Lifecycle.choices, default=Lifecycle.SPOT)
    state = models.CharField(max_length=20, choices=InstanceState.choices, default=InstanceState.REQUESTED)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    running_at = models.DateTimeField(null=True, blank=True)
    notice_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    terminate_requested_at = models.DateTimeField(
        null=True, blank=True,
        help_text="A terminate of ours is under way: its silence is ours, not a preemption (not marked lost).")
    standby_since = models.DateTimeField(
        null=True, blank=True, help_text="Since when its agent has been told to stand by (running, not a member of "
        "its job's current generation); cleared when a generation takes it (orchestration.services.standby).")
    agent_address = models.CharField(max_length=200, blank=True)
    # Unique through Meta.constraints rather than unique=True, which on PostgreSQL also builds a
    # LIKE (varchar_pattern_ops) index that no query uses.
    request_token = models.CharField(  # noqa: DJ001 - null: many rows without a token, unique when set
        max_length=64, null=True, blank=True,
        help_text="Idempotency key of the acquisition that created it, so a retried task acquires once.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "provider_instance_id"], name="instance_provider_id_unique"
            ),
            models.UniqueConstraint(fields=["request_token"], name="instance_request_token_unique"),
        ]
        indexes = [
            models.Index(fields=["team", "state"], name="instance_team_state_idx"),
            models.Index(fields=["job", "state"], name="instance_job_state_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.provider_instance_id or f'instance {self.pk}'} ({self.state})"

    @property
    def ended(self) -> bool:
        """In a terminal state: preempted, terminated or failed (`fleet.states.TERMINAL_STATES`)."""
        return self.state in TERMINAL_STATES


def job_model() -> type[models.Model]:
    """The model an instance's `job` points at (`jobs.TrainingJob`), reached through that foreign key:
    fleet locks and reads its instances' jobs (`fleet.locks`) without importing the jobs app, which
    builds on fleet's instances."""
    return Instance._meta.get_field("job").related_model


class InstanceEvent(models.Model):
    """Append-only log of what happened to an instance (state changes, heartbeat loss, ...)."""

    # (instance, at) serves lookups by instance: no single-column index to write on every event.
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events", db_index=False)
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    at = models.DateTimeField(db_index=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["instance", "at"], name="instanceevent_instance_at_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_state}->{self.to_state} at {self.at}"


class NoticeSource(models.TextChoices):
    AWS_EVENTBRIDGE = "aws_eventbridge", "AWS EventBridge"
    AWS_SNS = "aws_sns", "AWS SNS"
    GCP = "gcp", "GCP Pub/Sub"
    AZURE = "azure", "Azure scheduled events"
    AGENT = "agent", "Node agent"
    GENERIC = "generic", "Generic signed notice"


class NoticeKind(models.TextChoices):
    INTERRUPTION = "interruption", "Interruption warning"
    REBALANCE = "rebalance", "Rebalance recommendation"
    STATE_CHANGE = "state_change", "Instance state change"
    PREEMPTED = "preempted", "Preempted"


class NoticeStatus(models.TextChoices):
    RECEIVED = "received", "Received"
    ENQUEUED = "enqueued", "Handed to a worker"
    PROCESSED = "processed", "Processed"
    FAILED = "failed", "Failed"


class InterruptionNotice(models.Model):
    """A notice that a VM is about to go (or has gone), stored once per `dedup_key` before any
    reaction. A notice for an unknown instance is kept and flagged, never dropped."""

    # Indexes cost every insert on the webhook path (and every status update: status is indexed, so
    # no HOT update). Lookups by team use (team, received_at); dedup_key and provider_instance_id
    # get plain indexes, not also the LIKE indexes unique=True/db_index=True build on PostgreSQL
    # (10 indexes -> 7: PostgreSQL's CPU per stored notice went from 0.32 to 0.25 ms when measured;
    # the run is in docs/webhooks.md's git history).
    team = models.ForeignKey(
        "accounts.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="notices", db_index=False
    )
    source = models.CharField(max_length=20, choices=NoticeSource.choices)
    kind = models.CharField(max_length=20, choices=NoticeKind.choices)
    action = models.CharField(max_length=20, blank=True, help_text="terminate, stop, hibernate, preempt, ...")
    dedup_key = models.CharField(max_length=200)  # unique: Meta.constraints
    cloud_event_id = models.CharField(max_length=200, blank=True)
    provider_instance_id = models.CharField(max_length=100)  # indexed: Meta.indexes
    instance = models.ForeignKey(
        Instance, null=True, blank=True, on_delete=models.SET_NULL, related_name="notices"
    )
    unknown_instance = models.BooleanField(default=False)
    event_time = models.DateTimeField(null=True, blank=True, help_text="When the cloud says it happened.")
    deadline = models.DateTimeField(null=True, blank=True, help_text="When the VM is expected to go.")
    received_at = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=20, choices=NoticeStatus.choices, default=NoticeStatus.RECEIVED)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    payload = models.JSONField(default=dict)

    class Meta:
        indexes = [
            models.Index(fields=["status", "received_at"], name="notice_status_received_idx"),
            models.Index(fields=["team", "received_at"], name="notice_team_received_idx"),
            models.Index(fields=["provider_instance_id"], name="notice_provider_instance_idx"),
        ]
        constraints = [models.UniqueConstraint(fields=["dedup_key"], name="notice_dedup_key_unique")]

    def __str__(self) -> str:
        return f"{self.source} {self.kind} for {self.provider_instance_id}"
