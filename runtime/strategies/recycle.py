"""`recycle`: re-route a lost node's micro-batches to its same-stage peers in the other pipelines.

Only the lost hop moves: micro-batch m of pipeline p still runs every other stage on pipeline p's
nodes, and its stage-s hop runs on a surviving stage-s node of another pipeline (round-robin over
them, so the extra work is spread). Stage boundaries, the global batch and the data order are
unchanged, so no state moves and the math is identical. The split-backward (`fiw`) schedule puts
backward-input on the critical path and defers backward-weight into bubbles, which is where the
re-routed work fits; each node steps its optimizer as soon as its own all-reduce is done.
"""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.layout import Layout, pipelines_layout
from runtime.strategies.base import Slots


class RecycleStrategy:
    """Keep the full layout's stages and routes; patch each missing hop with a same-stage peer."""

    name = "recycle"
    restarts_from_checkpoint = False

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        # Stage boundaries come from the full layout; placeholder nodes keep routes well-formed.
        placeholder = [[p * config.pp + s for s in range(config.pp)] for p in range(config.dp)]
        base = pipelines_layout(config, placeholder)
        peers: list[list[int]] = []
        for s in range(config.pp):
            alive = [n for row in slots if (n := row[s]) is not None]
            if not alive:
                raise LayoutError(
                    f"recycle has no surviving node for stage {s} (slots {slots}); "
                    "expected at least one per stage"
                )
            peers.append(alive)
        routes = []
        turn = [0] * config.pp
        for m, route in enumerate(base.routes):
            p = base.pipeline_of[m]
            hops = []
            for stage, _ in route:
                node = slots[p][stage]
                if node is None:
                    node = peers[stage][turn[stage] % len(peers[stage])]
                    turn[stage] += 1
                hops.append((stage, node))
            routes.append(tuple(hops))
        return Layout(
            num_layers=base.num_layers,
            stages=base.stages,
            routes=tuple(routes),
            pipeline_of=base.pipeline_of,
            microbatch_size=base.microbatch_size,
        )
