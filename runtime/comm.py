"""Process groups of one generation, built directly on a TCPStore and torn down without a restart.

We create `ProcessGroupGloo` objects ourselves (not the global default group) so a generation's
groups can be dropped and rebuilt in-process: dropping every reference closes the sockets, which
makes the peers' pending gloo calls fail at once ("Connection closed by peer") instead of waiting
for their timeout. Every blocking call is bounded by `timeout`.
"""

from __future__ import annotations

import datetime
import gc
from collections.abc import Sequence

import torch
import torch.distributed as dist


class Comm:
    """The process groups of one generation, addressed by node id, not by rank.

    `world` spans the generation's members (point-to-point and the per-step commit); one extra group
    per gradient all-reduce set (`groups`), created only by its members.
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        prefix: str,
        node: int,
        members: Sequence[int],
        groups: Sequence[tuple[int, ...]] = (),
        timeout_s: float,
    ) -> None:
        self.node = node
        self.members = tuple(members)
        self.rank_of = {n: i for i, n in enumerate(self.members)}
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.world: dist.ProcessGroup | None = self._group(store, f"{prefix}/world", self.members)
        self.groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        for owners in groups:
            if node in owners and len(owners) > 1 and owners not in self.groups:
                name = "-".join(map(str, owners))
                self.groups[owners] = self._group(store, f"{prefix}/g{name}", owners)
        self.pending: list[dist.Work] = []

    def _group(self, store: dist.Store, prefix: str, members: Sequence[int]) -> dist.ProcessGroup:
        rank = list(members).index(self.node)
        return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, len(members), self.timeout)

    def _world(self) -> dist.ProcessGroup:
        if self.world is None:
            raise RuntimeError("communication of this generation was closed")
        return self.world

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        """Non-blocking send; completion is awaited by `wait_sends()` before the step commits."""
        self.pending.append(self._world().send([tensor], self.rank_of[dst], tag))

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None:
        """Blocking receive, bounded by the generation's timeout."""
        self._world().recv([tensor], self.rank_of[src], tag).wait(self.timeout)

    def wait_sends(self) -> None:
        """Wait for every outstanding send (bounded)."""
        for work in self.pending:
            work.wait(self.timeout)
        self.pending.clear()

    def allreduce(self, tensor: torch.Tensor, owners: tuple[int, ...]) -> dist.Work | None:
        """Start a sum all-reduce over `owners`; None if this node is the only owner."""
        group = self.groups.get(owners)
        if group is None:
            return None
        return group.allreduce([tensor])

    def commit(self, vector: torch.Tensor) -> torch.Tensor:
        """The per-step barrier: sum `vector` over all members. Completing it commits the step."""
        self._world().allreduce([vector]).wait(self.timeout)
        return vector

    def close(self) -> None:
        """Drop every group so peers blocked on us fail fast, then collect the sockets."""
        self.pending.clear()
        self.world = None
        self.groups.clear()
        gc.collect()


def transfer_group(
    store: dist.Store, *, prefix: str, node: int, members: Sequence[int], timeout_s: float
) -> Comm:
    """A short-lived group for state hand-over (may include leaving nodes, which then exit)."""
    return Comm(store, prefix=prefix, node=node, members=members, timeout_s=timeout_s)
