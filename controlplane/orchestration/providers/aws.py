"""The `aws` provider: EC2 spot and on-demand capacity through boto3, in one or several regions.

Two launch modes:
- `fleet` (default): one `CreateFleet` call of `Type=instant` over several pools at once, from a
  launch template that carries the agent's user-data; spot with `price-capacity-optimized`, or
  on-demand with `lowest-price`;
- `run_instances`: one `RunInstances` call in the cheapest pool (spot market options for spot).

Idempotency: EC2 honours `ClientToken`, and before launching we also look for instances tagged with
the request token (`spotpipe:request-token`); a retried launch adopts what the first one started.

Capacity: the offerings (`Pool.key`) that answer with one of `CAPACITY_CODES` are named in the
`InsufficientCapacity` raised when fewer nodes than asked came back; the nodes that did start ride
along in it (`nodes`), so the caller keeps them and asks elsewhere for the rest.

Regions: a launch goes to `LaunchRequest.region` (else the one region its pools name, else the
first configured one). `describe`/`terminate` take bare instance ids, so the provider remembers
the region of each id it launched or saw and asks every configured region about the others.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.market.zones import region_of_zone
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
from runtime.planner.capacity_policy import ON_DEMAND, SPOT

# Error codes worth retrying (throttling, eventual consistency, server errors).
TRANSIENT_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "ServiceUnavailable",
    "Unavailable", "InvalidInstanceID.NotFound",
})
_STATE = {"pending": "pending", "running": "running", "shutting-down": "stopping", "stopping": "stopping",
          "stopped": "terminated", "terminated": "terminated"}
# Ids per DescribeInstances filter (EC2 takes up to 200 values in one filter) and per
# TerminateInstances call (the API's limit).
_DESCRIBE_CHUNK = 200
_TERMINATE_CHUNK = 1000


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
    """Account-specific launch settings (see docs/orchestration.md for the IAM policy).

    `regions` are the regions nodes may start in, the first the default; left empty it is
    `(region,)`, so callers that only set `region` keep working. After construction `region` is
    always `regions[0]`. AMIs and security groups are regional: `image_id` and
    `security_group_ids` serve the default region, `image_by_region` and
    `security_groups_by_region` the others (an image given as `resolve:ssm:<parameter>` resolves in
    every region)."""

    regions: tuple[str, ...] = ()
    region: str = "us-east-1"
    endpoint_url: str | None = None
    image_id: str = ""
    key_name: str = ""
    security_group_ids: tuple[str, ...] = ()
    image_by_region: dict[str, str] | None = None
    security_groups_by_region: dict[str, tuple[str, ...]] | None = None
    subnet_by_zone: dict[str, str] | None = None
    """Subnet per zone name; zones name their region, so one map serves every region."""
    iam_instance_profile: str = ""
    launch_mode: str = "fleet"

    def __post_init__(self) -> None:
        regions = tuple(dict.fromkeys(r.strip() for r in self.regions if r and r.strip()))
        self.regions = regions or (self.region,)
        self.region = self.regions[0]


class _RegionMemory:
    """Instance id -> region, shared by every provider of this process: `get_provider` builds a
    new provider per call, and a node launched through one is described and terminated through
    later ones. Bounded (oldest forgotten first); a forgotten id is looked for in every region."""

    def __init__(self, limit: int = 100_000) -> None:
        self._regions: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def remember(self, node_id: str, region: str) -> None:
        with self._lock:
            self._regions[node_id] = region
            self._regions.move_to_end(node_id)
            while len(self._regions) > self._limit:
                self._regions.popitem(last=False)

    def recall(self, node_id: str) -> str:
        with self._lock:
            return self._regions.get(node_id, "")


REGION_MEMORY = _RegionMemory()


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in sorted(tags.items())]


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


class AwsProvider:
    """EC2 capacity. `client_factory(region)` returns a boto3 EC2 client for a region (tests pass
    one bound to a moto server; production builds one per region from the default credential
    chain). A region's client is made on first use and kept."""

    kind = "aws"

    def __init__(self, config: AwsConfig, *, client_factory: Callable[[str], Any] | None = None) -> None:
        self.config = config
        self._client_factory = client_factory
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()

    @property
    def regions(self) -> tuple[str, ...]:
        """The configured regions, the default first."""
        return self.config.regions

    def client_for(self, region: str) -> Any:
        """The EC2 client of `region` (under a lock: boto3's default session is not thread-safe)."""
        with self._clients_lock:
            client = self._clients.get(region)
            if client is None:
                if self._client_factory is not None:
                    client = self._client_factory(region)
                else:
                    import boto3

                    client = boto3.client("ec2", region_name=region, endpoint_url=self.config.endpoint_url)
                self._clients[region] = client
            return client

    @property
    def client(self) -> Any:
        """The default region's client."""
        return self.client_for(self.config.region)

    def _call(self, region: str, name: str, **params: Any) -> dict:
        try:
            return getattr(self.client_for(region), name)(**params)
        except Exception as exc:
            code = _error_code(exc)
            if not code:
                # Connection errors and timeouts: worth a retry.
                if exc.__class__.__module__.startswith(("botocore", "urllib3")):
                    raise ProviderError(f"{name} ({region}): {exc}", transient=True) from exc
                raise
            if code in CAPACITY_CODES:
                raise InsufficientCapacity(f"{name} ({region}): {code}: {exc}", code=code) from exc
            raise ProviderError(f"{name} ({region}): {code}: {exc}", transient=code in TRANSIENT_CODES,
                                code=code) from exc

    def image_for(self, region: str) -> str:
        """The image nodes of `region` boot; refuses a region-bound `ami-` id outside the default
        region (EC2 would answer InvalidAMIID.NotFound)."""
        image = (self.config.image_by_region or {}).get(region)
        if image is not None:
            return image
        if region != self.config.region and self.config.image_id.startswith("ami-"):
            raise ProviderError(f"no image for region {region!r}: {self.config.image_id} is an AMI of "
                                f"{self.config.region!r}; give one per region (`{region}=ami-...` in "
                                "SPOTPIPE_AWS_IMAGE_ID) or a `resolve:ssm:` parameter")
        return self.config.image_id

    def security_groups_for(self, region: str) -> tuple[str, ...]:
        """The security groups of nodes in `region` (group ids are regional, like images)."""
        groups = (self.config.security_groups_by_region or {}).get(region)
        if groups is not None:
            return tuple(groups)
        if region != self.config.region and self.config.security_group_ids:
            raise ProviderError(f"no security group for region {region!r}: {list(self.config.security_group_ids)} "
                                f"are groups of {self.config.region!r}; add `{region}=sg-...` entries to "
                                "SPOTPIPE_AWS_SECURITY_GROUPS")
        return self.config.security_group_ids

    # --- launch ----------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        """Adopt the nodes a previous launch with this token started, else launch new ones."""
        if request.count < 1:
            return []
        if not request.pools:
            raise ProviderError("launch request has no pool; expected at least one instance type")
        if request.capacity_type not in (SPOT, ON_DEMAND):
            raise ProviderError(f"unknown capacity type {request.capacity_type!r}; expected {SPOT!r} or "
                                f"{ON_DEMAND!r}")
        region = self.launch_region(request)
        existing = self.find_by_request(request.client_token, region=region)
        if existing:
            return existing
        if self.config.launch_mode == "run_instances":
            return self._run_instances(request, region)
        return self._create_fleet(request, region)

    def launch_region(self, request: LaunchRequest) -> str:
        """Where `request` launches: its `region`, else the one region its pools name (`Pool.region`
        or the zone's), else the default. Refuses a region that is not configured (describe and
        terminate would not look there) and pools of another region (EC2 would refuse them)."""
        def named(pool: Pool) -> set[str]:
            return {pool.region, region_of_zone(pool.zone)} - {""}

        pool_regions: set[str] = set().union(*(named(p) for p in request.pools))
        region = (request.region or (next(iter(pool_regions)) if len(pool_regions) == 1 else "")
                  or self.config.region)
        if region not in self.regions:
            raise ProviderError(f"region {region!r} is not one of the configured regions {list(self.regions)} "
                                "(SPOTPIPE_AWS_REGIONS)")
        stray = sorted(p.key for p in request.pools if named(p) - {region})
        if stray:
            raise ProviderError(f"pools {stray} are not in the launch's region {region!r}; one request, one region")
        return region

    def find_by_request(self, client_token: str, *, region: str = "") -> list[NodeInfo]:
        """Live nodes tagged with a launch's client token, in `region` ("" = every configured one)."""
        filters = [
            {"Name": f"tag:{TAG_REQUEST}", "Values": [client_token]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
        nodes = [n for r in ((region,) if region else self.regions) for n in self._describe(r, Filters=filters)]
        return sorted(nodes, key=lambda n: n.provider_instance_id)

    def _template_name(self, request: LaunchRequest) -> str:
        digest = hashlib.sha256(request.client_token.encode()).hexdigest()[:16]
        return f"spotpipe-{digest}"

    def _launch_template_data(self, request: LaunchRequest, region: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ImageId": self.image_for(region),
            "UserData": base64.b64encode(render_user_data(request.bootstrap).encode()).decode(),
            # IMDSv2 only: the agent's metadata watcher uses a session token.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tag_list(request.all_tags())}],
        }
        if self.config.key_name:
            data["KeyName"] = self.config.key_name
        if groups := self.security_groups_for(region):
            data["SecurityGroupIds"] = list(groups)
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

    def _zone_of_subnet(self, subnet: str) -> str:
        if not subnet:
            return ""
        return next((zone for zone, s in (self.config.subnet_by_zone or {}).items() if s == subnet), "")

    def _create_fleet(self, request: LaunchRequest, region: str) -> list[NodeInfo]:
        name = self._template_name(request)
        try:
            self._call(region, "create_launch_template", LaunchTemplateName=name,
                       ClientToken=request.client_token[:64],
                       LaunchTemplateData=self._launch_template_data(request, region),
                       TagSpecifications=[{"ResourceType": "launch-template",
                                           "Tags": _tag_list(request.all_tags())}])
        except ProviderError as exc:
            if "AlreadyExists" not in exc.code:
                raise
        tags = request.all_tags()
        on_demand = request.capacity_type == ON_DEMAND
        market: dict[str, Any] = (
            {"OnDemandOptions": {"AllocationStrategy": "lowest-price"}} if on_demand
            else {"SpotOptions": {"AllocationStrategy": "price-capacity-optimized"}})
        try:
            response = self._call(
                region, "create_fleet",
                Type="instant",
                ClientToken=request.client_token[:64],
                TargetCapacitySpecification={"TotalTargetCapacity": request.count,
                                             "DefaultTargetCapacityType": "on-demand" if on_demand else "spot"},
                **market,
                LaunchTemplateConfigs=[{
                    "LaunchTemplateSpecification": {"LaunchTemplateName": name, "Version": "$Latest"},
                    "Overrides": [self._override(pool) for pool in request.pools],
                }],
                TagSpecifications=[
                    {"ResourceType": "instance", "Tags": _tag_list(tags)},
                    {"ResourceType": "fleet", "Tags": _tag_list(tags)},
                ],
            )
        except InsufficientCapacity as exc:
            # The whole call said no: every offering of it failed.
            raise InsufficientCapacity(str(exc), code=exc.code, pools=[p.key for p in request.pools]) from exc
        launched = [(iid, group) for group in response.get("Instances", []) or []
                    for iid in group.get("InstanceIds", []) or []]
        nodes = self._launched_nodes(region, launched, request)
        if len(nodes) >= request.count:
            return nodes
        errors = response.get("Errors", []) or []
        codes = sorted({str(e.get("ErrorCode", "")) for e in errors} - {""})
        message = "; ".join(f"{e.get('ErrorCode')}: {e.get('ErrorMessage')}" for e in errors) or "no error given"
        capacity_errors = [e for e in errors if e.get("ErrorCode") in CAPACITY_CODES]
        if capacity_errors or (not nodes and not errors):
            # No error at all for an empty answer: which offering failed is unknown (pools=()).
            failed = dict.fromkeys(k for e in capacity_errors for k in self._error_pools(e, request.pools))
            raise InsufficientCapacity(
                f"create_fleet ({region}) launched {len(nodes)} of {request.count}: {message}",
                code=",".join(sorted({str(e["ErrorCode"]) for e in capacity_errors})), pools=list(failed),
                nodes=nodes)
        if nodes:
            # Fewer than asked and no offering said "no capacity": what started is returned, as before.
            return nodes
        raise ProviderError(f"create_fleet ({region}) launched nothing: {message}", code=",".join(codes),
                            transient=bool(codes) and set(codes) <= TRANSIENT_CODES)

    def _error_pools(self, error: dict[str, Any], pools: Sequence[Pool]) -> list[str]:
        """The keys of the request's pools a CreateFleet error names, matched on the override it
        echoes (instance type, and zone or subnet); one that matches no pool is named as EC2 gave it."""
        override = (error.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        itype = str(override.get("InstanceType") or "")
        subnet = str(override.get("SubnetId") or "")
        zone = str(override.get("AvailabilityZone") or "") or self._zone_of_subnet(subnet)
        keys = []
        for pool in pools:
            sent = self._override(pool)
            if itype and itype != pool.instance_type:
                continue
            if subnet and sent.get("SubnetId") and subnet != sent["SubnetId"]:
                continue
            if zone and pool.zone and zone != pool.zone:
                continue
            keys.append(pool.key)
        if not keys and itype:
            keys.append(Pool(instance_type=itype, zone=zone).key)
        return keys

    def _launched_nodes(self, region: str, launched: list[tuple[str, dict[str, Any]]],
                        request: LaunchRequest) -> list[NodeInfo]:
        """The nodes a launch reported, described; one DescribeInstances does not show yet (EC2 is
        eventually consistent) is built from the launch's own answer, `pending`."""
        for iid, _ in launched:
            REGION_MEMORY.remember(iid, region)
        described = self._find(region, [iid for iid, _ in launched])
        nodes = []
        for iid, group in launched:
            node = described.get(iid)
            if node is None:
                override = (group.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
                node = NodeInfo(
                    provider_instance_id=iid,
                    instance_type=str(group.get("InstanceType") or override.get("InstanceType") or ""),
                    zone=str(override.get("AvailabilityZone") or "") or self._zone_of_subnet(
                        str(override.get("SubnetId") or "")),
                    state="pending",
                    lifecycle=ON_DEMAND if group.get("Lifecycle") == "on-demand" else SPOT,
                    region=region,
                    tags=request.all_tags(),
                )
            nodes.append(node)
        return nodes

    def _run_instances(self, request: LaunchRequest, region: str) -> list[NodeInfo]:
        pool = min(request.pools, key=lambda p: (p.price is None, p.price or 0))
        params: dict[str, Any] = {
            "ImageId": self.image_for(region),
            "MinCount": request.count,
            "MaxCount": request.count,
            "InstanceType": pool.instance_type,
            "ClientToken": request.client_token[:64],
            "UserData": render_user_data(request.bootstrap),
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tag_list(request.all_tags())}],
        }
        if request.capacity_type == SPOT:
            # Without market options RunInstances starts on-demand instances.
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        subnet = (self.config.subnet_by_zone or {}).get(pool.zone)
        if subnet:
            params["SubnetId"] = subnet
        elif pool.zone:
            params["Placement"] = {"AvailabilityZone": pool.zone}
        if groups := self.security_groups_for(region):
            params["SecurityGroupIds"] = list(groups)
        if self.config.key_name:
            params["KeyName"] = self.config.key_name
        if self.config.iam_instance_profile:
            params["IamInstanceProfile"] = {"Name": self.config.iam_instance_profile}
        try:
            response = self._call(region, "run_instances", **params)
        except InsufficientCapacity as exc:
            # RunInstances tried this one pool; the caller goes on with the next ones.
            raise InsufficientCapacity(str(exc), code=exc.code, pools=[pool.key]) from exc
        nodes = [self._node(i, region) for i in response.get("Instances", [])]
        for node in nodes:
            REGION_MEMORY.remember(node.provider_instance_id, region)
        return nodes

    # --- describe / terminate -----------------------------------------------------------------------
    def _node(self, item: dict[str, Any], region: str) -> NodeInfo:
        tags = {t["Key"]: t["Value"] for t in item.get("Tags", []) or []}
        return NodeInfo(
            provider_instance_id=item["InstanceId"],
            instance_type=item.get("InstanceType", ""),
            zone=item.get("Placement", {}).get("AvailabilityZone", ""),
            state=_STATE.get(item.get("State", {}).get("Name", ""), "missing"),
            address=item.get("PrivateIpAddress", "") or "",
            # EC2 says "spot" for spot and omits the field for on-demand ("scheduled" and
            # "capacity-block" are not spot either).
            lifecycle=SPOT if item.get("InstanceLifecycle") == "spot" else ON_DEMAND,
            region=region,
            tags=tags,
        )

    def _describe(self, region: str, **params: Any) -> list[NodeInfo]:
        nodes: list[NodeInfo] = []
        token: str | None = None
        while True:
            page = self._call(region, "describe_instances", **params, **({"NextToken": token} if token else {}))
            for reservation in page.get("Reservations", []):
                nodes.extend(self._node(item, region) for item in reservation.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                for node in nodes:
                    REGION_MEMORY.remember(node.provider_instance_id, region)
                return nodes

    def _find(self, region: str, ids: Sequence[str]) -> dict[str, NodeInfo]:
        """The nodes of `ids` that `region` knows. A filter, not `InstanceIds`: one id unknown there
        (another region's, or long gone) would fail the whole call with InvalidInstanceID.NotFound."""
        found: dict[str, NodeInfo] = {}
        for chunk in _chunks(ids, _DESCRIBE_CHUNK):
            nodes = self._describe(region, Filters=[{"Name": "instance-id", "Values": chunk}])
            found.update({n.provider_instance_id: n for n in nodes})
        return found

    def _known_regions(self, ids: Sequence[str]) -> dict[str, list[str]]:
        by_region: dict[str, list[str]] = {}
        for iid in ids:
            region = REGION_MEMORY.recall(iid)
            if region in self.regions:
                by_region.setdefault(region, []).append(iid)
        return by_region

    def describe(self, ids: Sequence[str]) -> list[NodeInfo]:
        """States of `ids`, from whichever configured region holds each; ids no region knows come
        back `missing`. An id is asked first in the region it was last seen in, then in the others."""
        ids = list(dict.fromkeys(ids))
        found: dict[str, NodeInfo] = {}
        asked: dict[str, set[str]] = {}
        for region, known in self._known_regions(ids).items():
            found.update(self._find(region, known))
            asked[region] = set(known)
        for region in self.regions:
            rest = [i for i in ids if i not in found and i not in asked.get(region, ())]
            if rest:
                found.update(self._find(region, rest))
        return [found.get(i) or NodeInfo(provider_instance_id=i, instance_type="", zone="", state="missing",
                                         region=REGION_MEMORY.recall(i))
                for i in ids]

    def terminate(self, ids: Sequence[str]) -> None:
        """Terminate `ids` in the region of each; unknown ids are skipped. With one region every id
        is sent there; with several, ids this process has not seen are looked for first."""
        ids = list(dict.fromkeys(ids))
        if len(self.regions) == 1:
            by_region = {self.regions[0]: ids} if ids else {}
        else:
            by_region = self._known_regions(ids)
            placed = {i for known in by_region.values() for i in known}
            unplaced = [i for i in ids if i not in placed]
            for node in (self.describe(unplaced) if unplaced else []):
                if node.state != "missing":
                    by_region.setdefault(node.region, []).append(node.provider_instance_id)
        for region, region_ids in by_region.items():
            for chunk in _chunks(region_ids, _TERMINATE_CHUNK):
                self._terminate_in(region, chunk)

    def _terminate_in(self, region: str, ids: list[str]) -> None:
        try:
            self._call(region, "terminate_instances", InstanceIds=ids)
        except ProviderError as exc:
            if exc.code != "InvalidInstanceID.NotFound":
                raise
            # One unknown id fails the call on EC2: again with the ids the region knows.
            known = self._find(region, ids)
            if known:
                self._call(region, "terminate_instances", InstanceIds=[i for i in ids if i in known])
