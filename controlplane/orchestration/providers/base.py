"""The provider interface: what the orchestration services need from a source of spot capacity.

A provider launches, describes and terminates nodes. It knows nothing of jobs or the database;
the services translate between rows and these plain values. Every launch carries a client token
and tags, and a provider must be idempotent on the token: launching twice with the same token
returns the nodes of the first launch (a task that runs twice acquires once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol, runtime_checkable

# How a node is bought (spot or on_demand): the spellings the capacity policy owns.
from runtime.planner.capacity_policy import SPOT

TAG_PREFIX = "spotpipe:"
TAG_REQUEST = "spotpipe:request-token"
TAG_JOB = "spotpipe:job"
TAG_TEAM = "spotpipe:team"


class ProviderError(Exception):
    """The provider refused or failed a call. `transient` errors may be retried by the caller."""

    def __init__(self, message: str, *, transient: bool = False, code: str = "") -> None:
        super().__init__(message)
        self.transient = transient
        self.code = code


class InsufficientCapacity(ProviderError):
    """Some or all offerings of a request had no capacity now (AWS InsufficientInstanceCapacity,
    a quota, a max price too low: `CAPACITY_CODES`).

    `pools` are the keys (`Pool.key`) of the offerings that said no; empty means the provider could
    not tell which, so every pool of the request counts as failed. `nodes` are the nodes launched
    anyway (partial fulfilment): the caller keeps them and asks elsewhere for the rest."""

    def __init__(self, message: str, *, code: str = "", pools: Sequence[str] = (),
                 nodes: Sequence[NodeInfo] = ()) -> None:
        super().__init__(message, transient=False, code=code)
        self.pools = tuple(pools)
        self.nodes = list(nodes)


CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "UnfulfillableCapacity",
    "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow", "VcpuLimitExceeded",
    "InsufficientHostCapacity", "MaxFleetCountExceeded", "InstanceLimitExceeded",
})
"""Launch error codes that mean "no capacity in this offering now" (capacity, spot limits, quotas):
the offering is marked unavailable for a while and the launch goes on with the next ones."""



@dataclass(frozen=True, kw_only=True, slots=True)
class Pool:
    """One spot pool: an instance type in a zone, with the price the planner saw (USD/hour)."""

    instance_type: str
    zone: str = ""
    price: Decimal | None = None
    region: str = ""
    """The zone's region ("" = the provider's default region)."""

    @property
    def key(self) -> str:
        return f"{self.instance_type}@{self.zone or '*'}"


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentBootstrap:
    """What a new node needs to start its agent and find the control plane. The AWS provider
    renders it as user-data, the local provider as command-line arguments."""

    control_plane_url: str
    enroll_key: str
    cloud: str = "aws"
    heartbeat_s: float = 0.5
    agent_package: str = "spotpipe[runtime]"
    """What the node pip-installs: the agent and the torch runtime, none of the control plane."""
    extra_args: tuple[str, ...] = ()

    def agent_argv(self) -> list[str]:
        """Arguments of `spotpipe-agent` (the enrolment key is passed by environment, not argv,
        so it does not show in `ps`)."""
        return [
            "--control-plane", self.control_plane_url,
            "--cloud", self.cloud,
            "--heartbeat", str(self.heartbeat_s),
            *self.extra_args,
        ]


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchRequest:
    """Ask for `count` nodes of `capacity_type` (spot or on_demand) from any of `pools` (the
    provider picks by price and capacity). All pools of one request are in one region
    (`region`, "" = the provider's default)."""

    client_token: str
    count: int
    pools: tuple[Pool, ...]
    bootstrap: AgentBootstrap
    tags: dict[str, str] = field(default_factory=dict)
    capacity_type: str = SPOT
    region: str = ""

    def all_tags(self) -> dict[str, str]:
        """The caller's tags plus the idempotency tag every provider writes on its nodes."""
        return {**self.tags, TAG_REQUEST: self.client_token}


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeInfo:
    """What a provider knows of one node. `state` is one of NODE_STATES."""

    provider_instance_id: str
    instance_type: str
    zone: str
    state: str
    address: str = ""
    lifecycle: str = SPOT
    region: str = ""
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.state in ("pending", "running")


NODE_STATES = ("pending", "running", "stopping", "terminated", "missing")


@runtime_checkable
class Provider(Protocol):
    """A source of spot capacity."""

    kind: str

    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        """Start `request.count` nodes (or find those a previous launch with the same
        `client_token` started) and return them."""
        ...

    def describe(self, ids: Sequence[str]) -> list[NodeInfo]:
        """The current state of each id; an id the provider does not know is returned `missing`."""
        ...

    def terminate(self, ids: Sequence[str]) -> None:
        """Terminate the nodes; ids already gone are ignored."""
        ...
