"""Every `SPOTPIPE_*` tunable of the control plane, in one documented list, and the one way to read
them: `tunable(name)`.

A value comes from Django settings when a settings module (or a test's `settings` fixture) sets
it, else from the environment at the time of the call (so an operator's change to a worker's
environment, or a test's `monkeypatch.setenv`, is seen), else from the default declared here. An
undeclared name is a KeyError: a tunable that is not in this list does not exist.

docs/configuration.md is this list as a table (`markdown_table()`; a test keeps them equal). The
agent, the runtime and the CLI run without Django and document their own variables
(docs/orchestration.md, docs/runtime.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class Tunable:
    name: str
    # The value when neither settings nor the environment sets one; a callable is called each time
    # (defaults that derive from other settings). Its type (or `kind`) is how env strings are read.
    default: Any
    meaning: str
    kind: type = str
    # Read from this environment variable instead of `name` (a standard one, e.g. AWS_DEFAULT_REGION).
    env: str = ""

    def from_text(self, text: str) -> Any:
        if self.kind is bool:
            return text.strip().lower() in _TRUE
        if self.kind is list:
            return [part.strip() for part in text.split(",") if part.strip()]
        return self.kind(text)

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default


def _artifacts_default() -> str:
    return str(Path(settings.VAR_DIR) / "artifacts")


def _local_nodes_default() -> str:
    return str(Path(settings.VAR_DIR) / "nodes")


def _aws_regions_default() -> list[str]:
    return [tunable("SPOTPIPE_AWS_REGION")]


def _s3_endpoint_default() -> str:
    return tunable("SPOTPIPE_AWS_ENDPOINT_URL")


TUNABLES: tuple[Tunable, ...] = (
    # --- cloud and artifacts
    Tunable("SPOTPIPE_DEFAULT_PROVIDER", "local", "where a job runs when its plan names no provider (`local` or "
            "`aws`)"),
    Tunable("SPOTPIPE_AWS_REGION", "us-east-1", "the AWS region prices are pulled from and nodes started in",
            env="AWS_DEFAULT_REGION"),
    Tunable("SPOTPIPE_AWS_REGIONS", _aws_regions_default, "the regions aws nodes may be started in, the first "
            "the default (comma-separated; default: `SPOTPIPE_AWS_REGION`); the others' AMI and security groups "
            "are `region=id` entries of `SPOTPIPE_AWS_IMAGE_ID` and `SPOTPIPE_AWS_SECURITY_GROUPS`; S3 keeps its "
            "own region", kind=list),
    Tunable("SPOTPIPE_AWS_ENDPOINT_URL", "", "point boto3's EC2 client at another endpoint (moto in tests)"),
    Tunable("SPOTPIPE_S3_ENDPOINT_URL", _s3_endpoint_default, "point boto3's S3 client at another endpoint "
            "(default: `SPOTPIPE_AWS_ENDPOINT_URL`)"),
    Tunable("SPOTPIPE_AWS_INSTANCE_TYPES", ["p3.2xlarge", "g5.xlarge", "g6.xlarge"],
            "instance types a plan on aws may use when it names none (comma-separated)", kind=list),
    Tunable("SPOTPIPE_AWS_IMAGE_ID", "", "the AMI aws nodes boot"),
    Tunable("SPOTPIPE_AWS_KEY_NAME", "", "the EC2 key pair of aws nodes (empty: none)"),
    Tunable("SPOTPIPE_AWS_SECURITY_GROUPS", [], "security group ids of aws nodes (comma-separated)", kind=list),
    Tunable("SPOTPIPE_AWS_SUBNETS", [], "subnet per zone, `zone=subnet-id` pairs (comma-separated)", kind=list),
    Tunable("SPOTPIPE_AWS_INSTANCE_PROFILE", "", "the IAM instance profile of aws nodes (their S3 access)"),
    Tunable("SPOTPIPE_AWS_LAUNCH_MODE", "fleet", "`fleet` (CreateFleet, type instant) or `run_instances` "
            "(RunInstances)"),
    Tunable("SPOTPIPE_AWS_ACCOUNT_ID", "", "the account an enrolling node's signed identity document must name"),
    Tunable("SPOTPIPE_AWS_IDENTITY_CERT", "", "AWS's certificate for identity documents: a PEM file, or a folder "
            "of `<region>.pem`; needed when identities are checked"),
    Tunable("SPOTPIPE_ENROLL_VERIFY_IDENTITY", "auto", "check an enrolling node's signed identity document: "
            "`auto` (aws nodes only), `on`, `off`"),
    Tunable("SPOTPIPE_ARTIFACTS", _artifacts_default, "the artifact store: a folder the nodes see, or "
            "`s3://bucket/prefix`; each job's weights and checkpoints go to `job-<id>-<key>/` "
            "(default `var/artifacts`)"),
    Tunable("SPOTPIPE_PACKAGE_MAX_BYTES", 200 * 2**20, "the largest package a team may upload for its jobs' "
            "requirements", kind=int),
    Tunable("SPOTPIPE_PRICE_UPLOAD_MAX_BYTES", 200 * 2**20, "the largest spot price file staff may upload",
            kind=int),
    Tunable("SPOTPIPE_DATA_S3_CHECK", True, "at submit, check that the control plane can list and read a job's "
            "s3:// data and tokenizer", kind=bool),
    Tunable("SPOTPIPE_PULL_SPOT_PRICES", False, "beat pulls live spot prices from AWS every 10 minutes", kind=bool),
    Tunable("SPOTPIPE_PROFILE_DIR", "var/profiles", "measured layer profiles the planner prefers over its "
            "predictions"),
    # --- nodes and orchestration
    Tunable("SPOTPIPE_PUBLIC_URL", "http://127.0.0.1:8000", "the control plane's address as nodes reach it"),
    Tunable("SPOTPIPE_LOCAL_NODES_DIR", _local_nodes_default, "where the local provider keeps its nodes' "
            "folders (default `var/nodes`)"),
    Tunable("SPOTPIPE_LOCAL_NODE_ENV", [], "further variables of the control plane's environment that local "
            "nodes, and the jobs' code on them, get (comma-separated names): e.g. credentials scoped to the artifact "
            "store; the rest of its environment, with its secrets, stays out", kind=list),
    Tunable("SPOTPIPE_LOCAL_CAPACITY", "", "a capacity script for the local provider: a JSON file listing "
            "`{pool, from_s, to_s, error}` windows in which launches into `pool` (`TYPE@ZONE`) fail with `error` "
            "(docs/orchestration.md)"),
    Tunable("SPOTPIPE_CAPACITY_UNAVAILABLE_S", 180.0, "an offering that answered a capacity or quota error is "
            "not asked again, by any team, for this long", kind=float),
    Tunable("SPOTPIPE_CAPACITY_SWITCH_OVERHEAD_S", 120.0, "what one start, restart or switch of capacity type costs "
            "a job, in seconds of its deadline (the spot_then_on_demand rule keeps this margin)", kind=float),
    Tunable("SPOTPIPE_SPOT_PROGRESS_RATE", 0.8, "the share of full speed a job is expected to make on spot "
            "(preemptions and waits for capacity discounted) until it has measured its own or the planner "
            "predicted it", kind=float),
    Tunable("SPOTPIPE_REGION_PATIENCE_S", 600.0, "a job whose region has given no capacity for its missing nodes "
            "for this long moves to another of its regions that has some (its nodes write a checkpoint first, and it "
            "restarts from it)",
            kind=float),
    Tunable("SPOTPIPE_BUDGET_STOP_MARGIN_S", 60.0, "a job stops (checkpoint first) once its spend plus this many "
            "seconds of its fleet's spend reaches its budget or its team's monthly budget", kind=float),
    Tunable("SPOTPIPE_STOP_CHECKPOINT_WAIT_S", 60.0, "how long a stopping job's nodes may take to write and complete "
            "their checkpoint before they are released anyway (it then resumes from its newest complete one)",
            kind=float),
    Tunable("SPOTPIPE_STANDBY_LIMIT_S", 300.0, "a node told to stand by this long with no generation taking it is "
            "alerted and released", kind=float),
    Tunable("SPOTPIPE_ACCOUNT_MAX_VCPUS", 0, "the provider account's vCPU quota, shared between the teams that want "
            "capacity by fair share (a team borrows idle share and gives it back when asked); 0: no limit", kind=int),
    Tunable("SPOTPIPE_LOCAL_METADATA_CLOUD", "aws", "which cloud's metadata formats local nodes serve"),
    Tunable("SPOTPIPE_HEARTBEAT_S", 0.5, "how often agents heartbeat (sent to them at enrolment)", kind=float),
    Tunable("SPOTPIPE_HEARTBEAT_TIMEOUT_S", 2.0, "silence after which a node is declared dead", kind=float),
    Tunable("SPOTPIPE_JOB_STALL_TIMEOUT_S", 600.0, "a running job with no progress for this long is failed",
            kind=float),
    Tunable("SPOTPIPE_LOCK_WAIT_WARN_MS", 1000.0, "a transaction that waited longer than this for its jobs' and "
            "instances' row locks logs a warning naming them and the wait (`controlplane.fleet.locks`)", kind=float),
    Tunable("SPOTPIPE_RENDEZVOUS", "process", "`process`: the control plane hosts each job's rendezvous store in "
            "a process of its own; `none`: the nodes bring their own"),
    Tunable("SPOTPIPE_RENDEZVOUS_HOST", "127.0.0.1", "the address nodes use to reach that store"),
    Tunable("SPOTPIPE_REPLAN_PERIOD_S", 300.0, "how often beat re-plans jobs that allow it", kind=float),
    Tunable("SPOTPIPE_TRACKING_PERIOD_S", 15.0, "how often beat forwards new metrics of jobs with `tracking` to "
            "their experiment trackers (MLflow at `MLFLOW_TRACKING_URI`, W&B with `WANDB_API_KEY` or "
            "`WANDB_MODE=offline`, both from the control plane's environment)", kind=float),
    Tunable("SPOTPIPE_METRICS_ROLLUP_PERIOD_S", 60.0, "how often beat folds new notices, instances and "
            "reconfigurations into the metrics roll-up (a scrape counts the rows of the last two periods)",
            kind=float),
    Tunable("SPOTPIPE_USER_TOKEN_MAX_DAYS", 90, "user API tokens expire within this many days; one created without "
            "an expiry gets it", kind=int),
    Tunable("SPOTPIPE_AGENT_TOKEN_TTL_S", 86400, "agent tokens expire after this; agents rotate theirs at "
            "half-life", kind=int),
    Tunable("SPOTPIPE_WEB_THREADS", 16, "threads per web worker for everything but held agent polls "
            "(controlplane/asgi.py)", kind=int),
    Tunable("SPOTPIPE_AGENT_THREADS", 4, "threads per web worker for the agent channel's reads (answers after "
            "a wake-up, the batched poll)", kind=int),
    Tunable("SPOTPIPE_AGENT_POLL_S", 0.1, "without Redis, how often held agent polls look at the database: a "
            "notice -> command delay of at most this", kind=float),
    Tunable("SPOTPIPE_AGENT_POLL_REDIS_S", 1.0, "with Redis, the same poll, which then only covers a lost "
            "wake-up message", kind=float),
    Tunable("SPOTPIPE_HEARTBEAT_BATCH_S", 0.1, "the ASGI server answers the heartbeats of this window together, "
            "after ONE database write for all of them (controlplane/hotpaths/heartbeat_channel.py)", kind=float),
    Tunable("SPOTPIPE_POLL_BATCH_S", 0.1, "the ASGI server takes the first step of the agents' plain command "
            "polls of this window together: ONE read of their tokens and versions, then each is held or answered "
            "(controlplane/hotpaths/poll_channel.py)", kind=float),
    # --- notices and webhooks
    Tunable("SPOTPIPE_NOTICE_HANDOFF", "batched", "how stored notices reach workers: `batched` (coalesced kicks), "
            "`per_request` (one publish each: the bench's baseline), `none` (the sweep only; tests)"),
    Tunable("SPOTPIPE_NOTICE_KICK_WINDOW_S", 0.1, "at most one drain publish per this window per process",
            kind=float),
    Tunable("SPOTPIPE_NOTICE_DRAIN_SPACING_S", 0.25, "least time between the starts of two drains (0: no "
            "pacing)", kind=float),
    Tunable("SPOTPIPE_NOTICE_INSERT_PREPARED", True, "notice inserts as server-side prepared statements on "
            "PostgreSQL (turn off behind a transaction-mode pooler)", kind=bool),
    Tunable("SPOTPIPE_SNS_MAX_AGE_S", 3600, "SNS messages with an older signed `Timestamp` are refused as "
            "replays", kind=int),
    Tunable("SPOTPIPE_SNS_CERT_HOST_PATTERN", r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$",
            "hosts SNS signing certificates may be fetched from (a regular expression)"),
    Tunable("SPOTPIPE_SNS_ALLOW_HTTP", False, "fetch SNS certificates over plain HTTP (tests against a local "
            "server only)", kind=bool),
    Tunable("SPOTPIPE_GCP_OIDC_JWKS_URL", "https://www.googleapis.com/oauth2/v3/certs",
            "where GCP push OIDC tokens' signing keys are fetched (cached, rotated)"),
    Tunable("SPOTPIPE_ALERT_ALLOWED_NETWORKS", [], "CIDRs outbound alerts may reach besides public addresses "
            "(comma-separated)", kind=list),
    Tunable("SPOTPIPE_BENCH_ENDPOINTS", False, "serve the webhook bench's parse-only endpoint (`python -m bench "
            "webhooks` only)", kind=bool),
    # --- limits and operators
    Tunable("SPOTPIPE_RATELIMIT_LOGIN", 20, "POSTs to `/accounts/login/` and `/admin/login/` per client IP per "
            "window, together (0: off)", kind=int),
    Tunable("SPOTPIPE_RATELIMIT_ENROLL", 600, "POSTs to `/api/v1/agents/enroll/` per client IP per window",
            kind=int),
    Tunable("SPOTPIPE_RATELIMIT_WEBHOOKS", 6000, "requests to `/api/v1/webhooks/` per client IP per window",
            kind=int),
    Tunable("SPOTPIPE_RATELIMIT_WINDOW_S", 60, "the rate limits' window", kind=int),
    Tunable("SPOTPIPE_RATELIMIT_EXEMPT_LOOPBACK", False, "loopback clients are not limited (never behind a proxy "
            "on the same host)", kind=bool),
    Tunable("SPOTPIPE_THROTTLE_API", "3000/minute", "API requests per principal (a user, one agent, or an "
            "anonymous client's IP), as `N/second`, `/minute`, `/hour` or `/day`; `0`: off"),
    Tunable("SPOTPIPE_THROTTLE_PLANS", "60/minute", "`POST /api/v1/plans/` per principal, on top (each runs the "
            "planner); `0`: off"),
    Tunable("SPOTPIPE_METRICS_TOKEN", "", "bearer token for `/metrics` and the details of `/healthz` (unset: "
            "loopback clients only)"),
)

_BY_NAME: dict[str, Tunable] = {t.name: t for t in TUNABLES}


def tunable(name: str) -> Any:
    """The tunable's value: Django settings, else the environment, else its declared default."""
    value = getattr(settings, name, None)
    return value if value is not None else tunable_from_env(name)


def tunable_from_env(name: str) -> Any:
    """The tunable's value from the environment, else its default, without Django settings (for the
    settings module itself, e.g. the beat schedule it builds)."""
    spec = _BY_NAME[name]
    text = os.environ.get(spec.env or name)
    if text is None or (text == "" and spec.kind is not str):
        return spec.default_value()
    return spec.from_text(text)


def markdown_table() -> str:
    """docs/configuration.md's table: every tunable, its default and meaning."""

    def shown(spec: Tunable) -> str:
        if callable(spec.default):
            return "derived (see meaning)"
        if spec.kind is list:
            return ", ".join(spec.default) or "none"
        return f"`{spec.default}`" if spec.default != "" else "unset"

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for spec in TUNABLES:
        name = f"`{spec.name}`" + (f" (env `{spec.env}`)" if spec.env else "")
        rows.append(f"| {name} | {shown(spec)} | {spec.meaning} |")
    return "\n".join(rows) + "\n"
