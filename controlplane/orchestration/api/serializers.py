"""Input and output shapes of the agent protocol."""

from __future__ import annotations

from django.core.validators import RegexValidator
from rest_framework import serializers

from agent.command import ACTIONS
from controlplane.common.api import JSONObjectField
from controlplane.common.fields import CharField
from controlplane.fleet.models import NoticeKind, ProviderKind


class EnrollSerializer(serializers.Serializer):
    enroll_key = CharField(max_length=200)
    provider_instance_id = CharField(max_length=100)
    agent_address = CharField(max_length=200, required=False, allow_blank=True)
    # Exact bytes matter for the signature: no whitespace trimming.
    identity_document = CharField(
        max_length=8000, required=False, allow_blank=True, trim_whitespace=False, default="",
        help_text="AWS: the instance identity document, as IMDSv2 serves it (required when the provider is aws).")
    identity_signature = CharField(
        max_length=4000, required=False, allow_blank=True, default="",
        help_text="AWS: `/latest/dynamic/instance-identity/signature` (base64 RSA-SHA256 over the document).")


class EnrollResultSerializer(serializers.Serializer):
    instance = serializers.IntegerField()
    job = serializers.IntegerField(allow_null=True)
    token = CharField(help_text="Agent token (shown once): `Authorization: Token <token>`.")
    expires_at = serializers.DateTimeField(
        help_text="When the token stops working (SPOTPIPE_AGENT_TOKEN_TTL_S after issue); rotate it before "
                  "with `POST /agents/token/`.")


class AgentTokenRotatedSerializer(serializers.Serializer):
    instance = serializers.IntegerField()
    token = CharField(help_text="The new agent token (shown once); the one used for this call is "
                                            "revoked.")
    expires_at = serializers.DateTimeField()


# The longest hold an agent may ask for (the ASGI agent channel clips to it too).
COMMANDS_MAX_WAIT_S = 60


class CommandsQuerySerializer(serializers.Serializer):
    wait = serializers.FloatField(required=False, min_value=0, max_value=COMMANDS_MAX_WAIT_S, default=0,
                                  help_text="Seconds to hold the request while nothing changed (long-poll).")
    version = CharField(required=False, max_length=200, allow_blank=True, default="",
                                    help_text="The `version` of the last answer the agent acted on.")


class CommandsSerializer(serializers.Serializer):
    version = CharField()
    instance = serializers.IntegerField()
    provider_instance_id = CharField(allow_null=True)
    action = serializers.ChoiceField(choices=ACTIONS)  # the agent's reading of the answer owns the names
    job = serializers.JSONField(allow_null=True)
    generation = serializers.JSONField(allow_null=True)
    assignment = serializers.JSONField(allow_null=True)


class AgentNoticeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[NoticeKind.INTERRUPTION, NoticeKind.REBALANCE, NoticeKind.PREEMPTED])
    action = CharField(max_length=20, required=False, allow_blank=True, default="")
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    cloud = serializers.ChoiceField(choices=["aws", "gcp", "azure"], required=False, default="aws")
    raw = serializers.JSONField(required=False, default=dict)


class AgentNoticeResultSerializer(serializers.Serializer):
    notice = serializers.IntegerField(allow_null=True)
    duplicate = serializers.BooleanField()


LOG_TAIL_LINES = 20
"""Lines of a crashed worker's log an agent sends (what `end_log` shows of a user_error)."""


EVENT_ID_PATTERN = r"^[A-Za-z0-9_-]{8,64}$"
"""An agent event's id: 8 to 64 letters, digits, `-` or `_` (the agent sends a uuid4's 32 hex digits)."""


class AgentEventSerializer(serializers.Serializer):
    id = CharField(
        required=False, default="", validators=[RegexValidator(
            EVENT_ID_PATTERN, "expected 8 to 64 letters, digits, '-' or '_'")],
        help_text="The agent's id of this event, the same on every retry of it: an event that acts (a worker exit, "
                  "a failed install, profile or prepare) acts once per instance and id (a replay answers 202 and "
                  "changes nothing). Without one, every delivery acts.")
    kind = serializers.ChoiceField(choices=["worker_exit", "generation_applied", "worker_started", "worker_spare",
                                            "requirements_output", "requirements_failed", "profile_failed",
                                            "prepare_failed"])
    generation = serializers.IntegerField(required=False, min_value=0, allow_null=True, default=None)
    step = serializers.IntegerField(required=False, min_value=0, allow_null=True, default=None)
    code = serializers.IntegerField(required=False, allow_null=True, default=None)
    message = CharField(required=False, allow_blank=True, max_length=300, default="")
    log_tail = serializers.ListField(
        child=CharField(allow_blank=True, max_length=500), required=False, max_length=LOG_TAIL_LINES, default=list,
        help_text="worker_exit: the last lines of the worker's log (a crash's traceback).")


class UnavailableOfferingsQuerySerializer(serializers.Serializer):
    provider = serializers.ChoiceField(choices=ProviderKind.choices, required=False)


class UnavailableOfferingSerializer(serializers.Serializer):
    """One offering launches skip now (`controlplane.orchestration.offerings.Unavailability`)."""

    provider = CharField()
    instance_type = CharField()
    zone = CharField(help_text='"" when any zone of the type said no capacity.')
    region = CharField()
    capacity_type = CharField(help_text="spot or on_demand")
    reason = CharField(help_text="no_capacity (every team) or preempted (your team's cool-down)")
    code = CharField(help_text="The provider's error code, for no_capacity.")
    pool = CharField(help_text="TYPE@ZONE")
    until = serializers.DateTimeField()


class UnavailableOfferingListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    results = UnavailableOfferingSerializer(many=True)


class TerminateSerializer(serializers.Serializer):
    """Input of `POST /instances/{id}/terminate/`."""

    reason = CharField(max_length=200, required=False, allow_blank=True,
                       help_text="Recorded on the instance's and the job's events.")


class AgentShareClaimSerializer(serializers.Serializer):
    """The share of its job's prepare step a node prepares next (`controlplane.jobs.prepare_step`)."""

    state = CharField(help_text="assigned (prepare `share` of `of`), waiting (every share is taken; ask again), "
                                "prepared (the step is over) or stopped (the job ended).")
    share = serializers.IntegerField(allow_null=True)
    of = serializers.IntegerField(allow_null=True)
    source = CharField(help_text="The job's data.source, to prepare.")
    tokenizer = CharField()
    out = CharField(help_text="The job's data.prepare location.")


class AgentShareReportSerializer(serializers.Serializer):
    """What a node's share of the prepare step did (`runtime.data.prepare_share`'s line)."""

    share = serializers.IntegerField(min_value=0, max_value=1_000_000)
    of = serializers.IntegerField(min_value=1, max_value=1_000_000)
    index_written = serializers.BooleanField()
    files = serializers.IntegerField(min_value=0, max_value=10**9, default=0)
    input_bytes = serializers.IntegerField(min_value=0, max_value=2**62, default=0)
    seconds = serializers.FloatField(min_value=0, max_value=10**8, default=0.0)


class AgentProfileSerializer(serializers.Serializer):
    """What a job's first node measured of its model (`runtime.train.node_profile`); the measures'
    contents are checked as a submission's are (`jobs.replanning.profiled_contract`)."""

    layers = serializers.IntegerField(min_value=1, max_value=100_000)
    layer_measures = serializers.ListField(child=JSONObjectField(), min_length=1, max_length=100_000)
    layer_costs = serializers.ListField(child=serializers.FloatField(min_value=0), required=False, allow_null=True,
                                        max_length=100_000, default=None)
    declared = JSONObjectField(required=False, default=dict)
