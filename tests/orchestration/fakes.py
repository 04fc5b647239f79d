"""An in-memory provider for service tests: remembers every call, launches idempotently by token."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from controlplane.orchestration.providers.base import LaunchRequest, NodeInfo, ProviderError


class FakeProvider:
    """`refuse_terminate`: every terminate raises ProviderError, as a provider that denies it
    (UnauthorizedOperation) does; nothing is recorded."""

    kind = "local"

    def __init__(self, *, refuse_terminate: bool = False) -> None:
        self.refuse_terminate = refuse_terminate
        self.launches: list[LaunchRequest] = []
        self.terminated: list[str] = []
        self.nodes: dict[str, NodeInfo] = {}
        self.by_token: dict[str, list[str]] = {}
        self._ids = itertools.count(1)

    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        self.launches.append(request)
        if request.client_token not in self.by_token:
            ids = []
            for _ in range(request.count):
                node_id = f"fake-{next(self._ids)}"
                pool = request.pools[0]
                self.nodes[node_id] = NodeInfo(provider_instance_id=node_id, instance_type=pool.instance_type,
                                               zone=pool.zone, state="running")
                ids.append(node_id)
            self.by_token[request.client_token] = ids
        return [self.nodes[i] for i in self.by_token[request.client_token]]

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
