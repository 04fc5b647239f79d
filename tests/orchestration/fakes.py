"""An in-memory provider for service tests: remembers every call, launches idempotently by token."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from controlplane.orchestration.providers.base import InsufficientCapacity, LaunchRequest, NodeInfo, ProviderError


class FakeProvider:
    """`refuse_terminate`: every terminate raises ProviderError, as a provider that denies it
    (UnauthorizedOperation) does; nothing is recorded. `no_capacity[pool key] = (code, n)`: a launch
    whose first pool is that one launches `n` nodes there and raises InsufficientCapacity (like
    RunInstances, one pool a call)."""

    kind = "local"

    def __init__(self, *, refuse_terminate: bool = False) -> None:
        self.refuse_terminate = refuse_terminate
        self.launches: list[LaunchRequest] = []
        self.terminated: list[str] = []
        self.nodes: dict[str, NodeInfo] = {}
        self.by_token: dict[str, list[str]] = {}
        self._ids = itertools.count(1)
        self.no_capacity: dict[str, tuple[str, int]] = {}

    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        self.launches.append(request)
        refused = self.no_capacity.get(request.pools[0].key)
        if refused is not None and request.client_token not in self.by_token:
            code, partial = refused
            self.by_token[request.client_token] = self._start(request, min(partial, request.count))
            raise InsufficientCapacity(f"{code} in {request.pools[0].key}", code=code, pools=[request.pools[0].key],
                                       nodes=[self.nodes[i] for i in self.by_token[request.client_token]])
        if request.client_token not in self.by_token:
            self.by_token[request.client_token] = self._start(request, request.count)
        return [self.nodes[i] for i in self.by_token[request.client_token]]

    def _start(self, request: LaunchRequest, count: int) -> list[str]:
        ids = []
        for _ in range(count):
            node_id = f"fake-{next(self._ids)}"
            pool = request.pools[0]
            self.nodes[node_id] = NodeInfo(provider_instance_id=node_id, instance_type=pool.instance_type,
                                           zone=pool.zone, state="running", lifecycle=request.capacity_type)
            ids.append(node_id)
        return ids

    def describe(self, ids: Sequence[str]) -> list[NodeInfo]:
        return [self.nodes.get(i) or NodeInfo(provider_instance_id=i, instance_type="", zone="", state="missing")
                for i in ids]

    def terminate(self, ids: Sequence[str]) -> None:
        if self.refuse_terminate:
            raise ProviderError("UnauthorizedOperation: not allowed to terminate")
        for node_id in ids:
            self.terminated.append(node_id)
            if node_id in self.nodes:
                node = self.nodes[node_id]
                self.nodes[node_id] = NodeInfo(provider_instance_id=node_id, instance_type=node.instance_type,
                                               zone=node.zone, state="terminated")

    def vanish(self, node_id: str) -> None:
        """The cloud took the node back without telling anyone."""
        self.terminate([node_id])
        self.terminated.remove(node_id)
