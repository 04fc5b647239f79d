"""`bamboo`: every node keeps a replica of its successor stage and runs its forward in bubbles.

The replica is an owner of the successor's layers in the gradient all-reduce (contributing zeros),
so it applies the very same optimizer step and stays bit-for-bit in sync without extra messages.
When a node is lost, its ring predecessor in the same pipeline (which holds the replica) takes its
stages over: the pipeline keeps running with one node fewer, without restart and without moving
any state. A pipeline that loses every node hands its micro-batches to the other pipelines.
"""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Hop, Layout, pipelines_layout
from runtime.strategies.base import Slots


def _owners(row: list[int | None]) -> list[int] | None:
    """Node per stage: the slot's node or its nearest alive ring predecessor (None: all gone)."""
    if all(n is None for n in row):
        return None
    out: list[int] = []
    for s in range(len(row)):
        k = s
        while row[k % len(row)] is None:
            k -= 1
        node = row[k % len(row)]
        assert node is not None
        out.append(node)
    return out


class BambooStrategy:
    """Redundant successor replicas; takeover by the predecessor."""

    name = "bamboo"
    decision = "takeover"
    restarts_from_checkpoint = False
    falls_back_to_checkpoint = True
    simulated_schedule = "1f1b"
    plans_from_count = False
    plans_per_row = True  # the takeover stays in the pipeline
    rows_interchangeable = True
    recovery_s = 10.0 + 5.0  # the takeover, then detection
    batches_joiners = False  # a joiner fills a taken-over slot

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        placeholder = [[p * config.pp + s for s in range(config.pp)] for p in range(config.dp)]
        base = pipelines_layout(config, placeholder)
        found = [_owners(row) for row in slots]
        owners = {p: o for p, o in enumerate(found) if o is not None}
        alive_pipes = sorted(owners)
        if not alive_pipes:
            raise LayoutError("bamboo has no surviving pipeline; expected at least one node alive")
        routes, pipeline_of = [], []
        orphan = 0
        for m in range(base.num_microbatches):
            p = base.pipeline_of[m]
            if p not in owners:  # whole pipeline lost: hand its micro-batches round-robin to the others
                p = alive_pipes[orphan % len(alive_pipes)]
                orphan += 1
            routes.append(tuple((s, owners[p][s]) for s in range(config.pp)))
            pipeline_of.append(p)
        replicas: list[Hop] = []
        for p in alive_pipes:
            own = owners[p]
            for s in range(config.pp):
                nxt = (s + 1) % config.pp
                if own[nxt] != own[s] and (nxt, own[s]) not in replicas:
                    replicas.append((nxt, own[s]))
        layout = base.with_routes(routes, pipeline_of, replicas=replicas)
        layout.validate()
        return layout
