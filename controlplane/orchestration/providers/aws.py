"""The `aws` provider: EC2 spot capacity through boto3.

Two launch modes:
- `fleet` (default): one `CreateFleet` call of `Type=instant` over several pools at once, spot,
  `price-capacity-optimized`, from a launch template that carries the agent's user-data;
- `run_instances`: one `RunInstances` call in the cheapest pool with spot market options.

Idempotency: EC2 honours `ClientToken`, and before launching we also look for instances tagged with
the request token (`spotpipe:request-token`); a retried launch adopts what the first one started.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.orchestration.providers.base import (
    CAPACITY_CODES,
    TAG_REQUEST,
    AgentBootstrap,
    InsufficientCapacity,
    LaunchRequest,
    NodeInfo,
    Pool,
    ProviderError,
)

# Error codes worth retrying (throttling, eventual consistency, server errors).
TRANSIENT_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "ServiceUnavailable",
    "Unavailable", "InvalidInstanceID.NotFound",
})
_STATE = {"pending": "pending", "running": "running", "shutting-down": "stopping", "stopping": "stopping",
          "stopped": "terminated", "terminated": "terminated"}


def render_user_data(bootstrap: AgentBootstrap) -> str:
    """A cloud-init shell script that installs spotpipe and runs the agent as a systemd service,
    so it restarts if it crashes and stops with the VM."""
    argv = " ".join(shlex.quote(a) for a in ["spotpipe-agent", *bootstrap.agent_argv()])
    return f"""#!/bin/bash
set -euo pipefail
python3 -m venv /opt/spotpipe
/opt/spotpipe/bin/pip install --quiet {shlex.quote(bootstrap.agent_package)}
install -d -m 700 /etc/spotpipe
cat > /etc/spotpipe/agent.env <<'EOF'
SPOTPIPE_ENROLL_KEY={bootstrap.enroll_key}
EOF
chmod 600 /etc/spotpipe/agent.env
cat > /etc/systemd/system/spotpipe-agent.service <<'EOF'
[Unit]
Description=spotpipe node agent
After=network-online.target
[Service]
EnvironmentFile=/etc/spotpipe/agent.env
ExecStart=/opt/spotpipe/bin/{argv}
Restart=always
RestartSec=2
KillMode=control-group
[Install]
WantedBy=multi-user.target
EOF
systemctl daemon-reload
systemctl enable --now spotpipe-agent.service
"""


@dataclass(kw_only=True)
class AwsConfig:
    """Account-specific launch settings (see docs/orchestration.md for the IAM policy)."""

    region: str = "us-east-1"
    endpoint_url: str | None = None
    image_id: str = ""
    key_name: str = ""
    security_group_ids: tuple[str, ...] = ()
    subnet_by_zone: dict[str, str] | None = None
    iam_instance_profile: str = ""
    launch_mode: str = "fleet"


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in sorted(tags.items())]


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class AwsProvider:
    """EC2 spot capacity. `client_factory` returns a boto3 EC2 client (tests pass one bound to a
    moto server; production builds one from the default credential chain)."""

    kind = "aws"

    def __init__(self, config: AwsConfig, *, client_factory: Callable[[], Any] | None = None) -> None:
        self.config = config
        self._client_factory = client_factory
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory()
            else:
                import boto3

                self._client = boto3.client("ec2", region_name=self.config.region,
                                            endpoint_url=self.config.endpoint_url)
        return self._client

    def _call(self, name: str, **params: Any) -> dict:
        try:
            return getattr(self.client, name)(**params)
        except Exception as exc:
            code = _error_code(exc)
            if not code:
                # Connection errors and timeouts: worth a retry.
                if exc.__class__.__module__.startswith(("botocore", "urllib3")):
                    raise ProviderError(f"{name}: {exc}", transient=True) from exc
                raise
            if code in CAPACITY_CODES:
                raise InsufficientCapacity(f"{name}: {code}: {exc}", code=code) from exc
            raise ProviderError(f"{name}: {code}: {exc}", transient=code in TRANSIENT_CODES, code=code) from exc

    # --- launch ----------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        """Adopt the nodes a previous launch with this token started, else launch new ones."""
        if request.count < 1:
            return []
        if not request.pools:
            raise ProviderError("launch request has no pool; expected at least one instance type")
        existing = self.find_by_request(request.client_token)
        if existing:
            return existing
        if self.config.launch_mode == "run_instances":
            return self._run_instances(request)
        return self._create_fleet(request)

    def find_by_request(self, client_token: str) -> list[NodeInfo]:
        """Live nodes tagged with a launch's client token."""
        nodes = self._describe(Filters=[
            {"Name": f"tag:{TAG_REQUEST}", "Values": [client_token]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ])
        return sorted(nodes, key=lambda n: n.provider_instance_id)

    def _template_name(self, request: LaunchRequest) -> str:
        digest = hashlib.sha256(request.client_token.encode()).hexdigest()[:16]
        return f"spotpipe-{digest}"

    def _launch_template_data(self, request: LaunchRequest) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ImageId": self.config.image_id,
            "UserData": base64.b64encode(render_user_data(request.bootstrap).encode()).decode(),
            # IMDSv2 only: the agent's metadata watcher uses a session token.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tag_list(request.all_tags())}],
        }
        if self.config.key_name:
            data["KeyName"] = self.config.key_name
        if self.config.security_group_ids:
            data["SecurityGroupIds"] = list(self.config.security_group_ids)
        if self.config.iam_instance_profile:
            data["IamInstanceProfile"] = {"Name": self.config.iam_instance_profile}
        return data

    def _override(self, pool: Pool) -> dict[str, Any]:
        override: dict[str, Any] = {"InstanceType": pool.instance_type}
        subnet = (self.config.subnet_by_zone or {}).get(pool.zone)
        if subnet:
            override["SubnetId"] = subnet
        elif pool.zone:
            override["AvailabilityZone"] = pool.zone
        return override

    def _create_fleet(self, request: LaunchRequest) -> list[NodeInfo]:
        name = self._template_name(request)
        try:
            self._call("create_launch_template", LaunchTemplateName=name, ClientToken=request.client_token[:64],
                       LaunchTemplateData=self._launch_template_data(request),
                       TagSpecifications=[{"ResourceType": "launch-template",
                                           "Tags": _tag_list(request.all_tags())}])
        except ProviderError as exc:
            if "AlreadyExists" not in exc.code:
                raise
        tags = request.all_tags()
        response = self._call(
            "create_fleet",
            Type="instant",
            ClientToken=request.client_token[:64],
            TargetCapacitySpecification={"TotalTargetCapacity": request.count, "DefaultTargetCapacityType": "spot"},
            SpotOptions={"AllocationStrategy": "price-capacity-optimized"},
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateName": name, "Version": "$Latest"},
                "Overrides": [self._override(pool) for pool in request.pools],
            }],
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {"ResourceType": "fleet", "Tags": _tag_list(tags)},
            ],
        )
        ids = [iid for group in response.get("Instances", []) for iid in group.get("InstanceIds", [])]
        if not ids:
            errors = response.get("Errors", [])
            codes = {e.get("ErrorCode", "") for e in errors}
            message = "; ".join(f"{e.get('ErrorCode')}: {e.get('ErrorMessage')}" for e in errors) or "no instance"
            if codes & CAPACITY_CODES or not errors:
                raise InsufficientCapacity(f"create_fleet launched nothing: {message}", code=",".join(sorted(codes)))
            raise ProviderError(f"create_fleet launched nothing: {message}", code=",".join(sorted(codes)))
        return self.describe(ids)

    def _run_instances(self, request: LaunchRequest) -> list[NodeInfo]:
        pool = min(request.pools, key=lambda p: (p.price is None, p.price or 0))
        params: dict[str, Any] = {
            "ImageId": self.config.image_id,
            "MinCount": request.count,
            "MaxCount": request.count,
            "InstanceType": pool.instance_type,
            "ClientToken": request.client_token[:64],
            "UserData": render_user_data(request.bootstrap),
            "InstanceMarketOptions": {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            },
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tag_list(request.all_tags())}],
        }
        subnet = (self.config.subnet_by_zone or {}).get(pool.zone)
        if subnet:
            params["SubnetId"] = subnet
        elif pool.zone:
            params["Placement"] = {"AvailabilityZone": pool.zone}
        if self.config.security_group_ids:
            params["SecurityGroupIds"] = list(self.config.security_group_ids)
        if self.config.key_name:
            params["KeyName"] = self.config.key_name
        if self.config.iam_instance_profile:
            params["IamInstanceProfile"] = {"Name": self.config.iam_instance_profile}
        response = self._call("run_instances", **params)
        return [self._node(i) for i in response.get("Instances", [])]

    # --- describe / terminate -----------------------------------------------------------------------
    def _node(self, item: dict[str, Any]) -> NodeInfo:
        tags = {t["Key"]: t["Value"] for t in item.get("Tags", []) or []}
        return NodeInfo(
            provider_instance_id=item["InstanceId"],
            instance_type=item.get("InstanceType", ""),
            zone=item.get("Placement", {}).get("AvailabilityZone", ""),
            state=_STATE.get(item.get("State", {}).get("Name", ""), "missing"),
            address=item.get("PrivateIpAddress", "") or "",
            lifecycle=item.get("InstanceLifecycle", "on_demand") or "on_demand",
            tags=tags,
        )

    def _describe(self, **params: Any) -> list[NodeInfo]:
        nodes: list[NodeInfo] = []
        token: str | None = None
        while True:
            page = self._call("describe_instances", **params, **({"NextToken": token} if token else {}))
            for reservation in page.get("Reservations", []):
                nodes.extend(self._node(item) for item in reservation.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                return nodes

    def describe(self, ids: Sequence[str]) -> list[NodeInfo]:
        """States of `ids`; ids EC2 no longer knows come back `missing`."""
        ids = list(dict.fromkeys(ids))
        found: dict[str, NodeInfo] = {}
        for start in range(0, len(ids), 200):
            chunk = ids[start:start + 200]
            try:
                nodes = self._describe(InstanceIds=chunk)
            except ProviderError as exc:
                if exc.code != "InvalidInstanceID.NotFound":
                    raise
                # One unknown id fails the whole call: ask one by one.
                nodes = []
                for iid in chunk:
                    try:
                        nodes += self._describe(InstanceIds=[iid])
                    except ProviderError as inner:
                        if inner.code != "InvalidInstanceID.NotFound":
                            raise
            found.update({n.provider_instance_id: n for n in nodes})
        return [found.get(i) or NodeInfo(provider_instance_id=i, instance_type="", zone="", state="missing")
                for i in ids]

    def terminate(self, ids: Sequence[str]) -> None:
        """Terminate `ids` (1000 per call, the API's limit); unknown ids are skipped."""
        ids = list(dict.fromkeys(ids))
        for start in range(0, len(ids), 1000):
            chunk = ids[start:start + 1000]
            try:
                self._call("terminate_instances", InstanceIds=chunk)
            except ProviderError as exc:
                if exc.code != "InvalidInstanceID.NotFound":
                    raise
                known = [n.provider_instance_id for n in self.describe(chunk) if n.state != "missing"]
                if known:
                    self._call("terminate_instances", InstanceIds=known)
