"""Acquisitions: every request for spot capacity is a row, so the job's story shows when nodes were
asked for, from which pools, and when (or whether) they came."""

from __future__ import annotations

from django.db import models


class AcquisitionStatus(models.TextChoices):
    REQUESTED = "requested", "Requested"
    LAUNCHING = "launching", "Launching"
    FULFILLED = "fulfilled", "Fulfilled"
    FAILED = "failed", "Failed"


class AcquisitionReason(models.TextChoices):
    INITIAL = "initial", "Initial capacity of the plan"
    REPLACEMENT = "replacement", "Replacement of lost nodes"


class Acquisition(models.Model):
    """One request for `count` nodes for a job. `request_token` is the idempotency key: a task that
    runs twice finds this row (and the provider finds the nodes it already launched). The job's
    instances of this acquisition carry `request_token` = `<acquisition token>/<index>`."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="acquisitions")
    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="acquisitions")
    request_token = models.CharField(max_length=64, unique=True)
    provider = models.CharField(max_length=20)
    count = models.PositiveIntegerField()
    pools = models.JSONField(default=list, help_text="[{instance_type, zone, price}] offered to the provider.")
    avoided_pools = models.JSONField(default=list, blank=True, help_text="Pools left out: they just preempted us.")
    capacity_type = models.CharField(max_length=20, default="spot", help_text="spot or on_demand.")
    failed_pools = models.JSONField(default=list, blank=True,
                                    help_text="[{pool, code}] offerings that had no capacity during the launch.")
    reason = models.CharField(max_length=20, choices=AcquisitionReason.choices, default=AcquisitionReason.INITIAL)
    status = models.CharField(max_length=20, choices=AcquisitionStatus.choices, default=AcquisitionStatus.REQUESTED)
    attempts = models.PositiveIntegerField(default=0)
    launched = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    requested_at = models.DateTimeField()
    launch_started_at = models.DateTimeField(null=True, blank=True)
    fulfilled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["requested_at", "id"]
        indexes = [models.Index(fields=["job", "status"], name="acquisition_job_status_idx")]

    def __str__(self) -> str:
        return f"{self.request_token} x{self.count} ({self.status})"


class Rendezvous(models.Model):
    """Where a job's workers meet: the TCPStore that carries their generations, heartbeats, notices
    and join requests. Hosted by the control plane's host in its own process (a node's death must
    not take it down), one per job, released with the job's capacity."""

    job = models.OneToOneField("jobs.TrainingJob", on_delete=models.CASCADE, related_name="rendezvous")
    address = models.CharField(max_length=200, help_text="host:port the workers dial.")
    pid = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.job_id} @ {self.address}"


class HeartbeatWatch(models.Model):
    """The dead-agent detector's memory (one row): when it last ran, and until when the control plane
    was deaf to heartbeats (its web server, database or worker was down, so no node could be heard).
    Silence is counted from the end of the last deaf spell: an outage of the control plane must not
    make every node look dead."""

    key = models.CharField(max_length=20, primary_key=True, default="heartbeats")
    last_run_at = models.DateTimeField(null=True, blank=True)
    deaf_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"ran {self.last_run_at}, deaf until {self.deaf_until}"


class UnavailableOffering(models.Model):
    """An offering (provider, instance type, zone, capacity type) that answered "no capacity" (or a
    quota error): no launch, of any team, asks it again before `until` (Karpenter's unavailable
    offerings cache). Read together with the team-scoped cool-down after a preemption by
    `controlplane.orchestration.offerings`, the one reader of both."""

    provider = models.CharField(max_length=20)
    instance_type = models.CharField(max_length=64)
    zone = models.CharField(max_length=64, blank=True, help_text='"" when the launch named no zone.')
    capacity_type = models.CharField(max_length=20, help_text="spot or on_demand (fleet.models.Lifecycle).")
    region = models.CharField(max_length=40, blank=True)
    code = models.CharField(max_length=100, help_text="The provider's error code, e.g. InsufficientInstanceCapacity.")
    marked_at = models.DateTimeField()
    until = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "instance_type", "zone", "capacity_type"],
                                               name="unavailable_offering_unique")]
        indexes = [models.Index(fields=["until"], name="unavailable_offering_until_idx")]
        ordering = ["until", "id"]

    def __str__(self) -> str:
        return f"{self.instance_type}@{self.zone or '*'}/{self.capacity_type} until {self.until}"


class AgentEventReceipt(models.Model):
    """An agent event acted on, by the id its agent gave it (`POST /agents/events/`): the agent
    retries a POST whose answer it lost, so a replay must find this row and act no more. The unique
    key, not a read first, decides, so two deliveries of one event at the same moment act once."""

    # The unique key below leads with the instance: no separate index to write on every event.
    instance = models.ForeignKey("fleet.Instance", on_delete=models.CASCADE, related_name="+", db_index=False)
    event_id = models.CharField(max_length=64)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance", "event_id"], name="agent_event_once")]

    def __str__(self) -> str:
        return f"{self.instance_id}: {self.event_id}"
