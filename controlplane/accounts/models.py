"""Teams, memberships and API tokens. Every other object belongs to exactly one team."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from controlplane.common.models import TimeStampedModel


class Team(TimeStampedModel):
    """A group of users that owns jobs, instances and costs; the unit of isolation."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=60, unique=True)

    def __str__(self) -> str:
        return self.slug


class TeamQuota(models.Model):
    """A team's limits (`controlplane.jobs.admission` enforces them): nodes held at once, jobs
    admitted at once, and spend per calendar month (UTC). A null limit is no limit."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota", primary_key=True)
    max_nodes = models.PositiveIntegerField(null=True, blank=True, help_text="Nodes the team's jobs hold at once.")
    max_jobs = models.PositiveIntegerField(null=True, blank=True, help_text="Jobs admitted (not queued) at once.")
    monthly_budget_usd = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True,
        help_text="Spend per calendar month (UTC); at the cap the team's jobs stop as at a job's budget.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(monthly_budget_usd__isnull=True)
                                   | models.Q(monthly_budget_usd__gt=0), name="teamquota_budget_positive"),
        ]

    def __str__(self) -> str:
        return f"quota of {self.team_id}"


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    ADMIN = "admin", "Admin"


class Membership(TimeStampedModel):
    """A user's role in a team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_team_user_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class TokenKind(models.TextChoices):
    USER = "user", "User"
    AGENT = "agent", "Node agent"


class ApiToken(TimeStampedModel):
    """A bearer token. Only a SHA-256 of the key is stored; the key is shown once at creation.

    User tokens act as their user within `team`. Agent tokens act for one node (`instance`) only:
    at most one live (unrevoked) agent token per instance, revoked when the instance ends, and
    expiring after SPOTPIPE_AGENT_TOKEN_TTL_S unless rotated.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    kind = models.CharField(max_length=10, choices=TokenKind.choices, default=TokenKind.USER)
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, db_index=True, help_text="First characters, to recognise a key.")
    key_hash = models.CharField(max_length=64, unique=True)
    instance = models.ForeignKey(
        "fleet.Instance", null=True, blank=True, on_delete=models.CASCADE, related_name="agent_tokens"
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind="agent") | models.Q(user__isnull=False),
                name="apitoken_user_token_has_user",
            ),
            # A backstop for agent_token enrolment's row lock: a second live token cannot exist.
            models.UniqueConstraint(
                fields=["instance"],
                condition=models.Q(kind="agent", revoked_at__isnull=True),
                name="apitoken_one_live_agent_token_per_instance",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} token {self.prefix}… ({self.team})"
