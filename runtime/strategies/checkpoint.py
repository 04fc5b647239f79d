"""`checkpoint`: periodic checkpoints; after any change, restart from the last one.

The baseline: survivors (and replacements) regroup into as many full pipelines as they can fill,
reload the last complete checkpoint and replay the steps since. Checkpoints (every strategy writes
them) and their interval are `runtime.checkpointing.checkpoints` and `runtime.checkpointing.durability`.
"""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Layout, pipelines_layout
from runtime.strategies.base import Slots, alive_nodes


class CheckpointStrategy:
    """Full pipelines only; state always comes back from the checkpoint."""

    name = "checkpoint"
    decision = "restart"
    restarts_from_checkpoint = True
    falls_back_to_checkpoint = False  # it always restarts from one
    simulated_schedule = "1f1b"
    plans_from_count = True
    plans_per_row = False
    rows_interchangeable = True
    recovery_s = 120.0 + 5.0  # a restart from the checkpoint, then detection
    batches_joiners = True  # every regroup is a restart from the checkpoint

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        nodes = alive_nodes(slots)
        full = len(nodes) // config.pp
        if full < 1:
            raise LayoutError(
                f"{len(nodes)} nodes cannot fill one pipeline; expected at least pp={config.pp}"
            )
        pipes = [nodes[i * config.pp : (i + 1) * config.pp] for i in range(full)]
        return pipelines_layout(config, pipes, standby=tuple(nodes[full * config.pp :]))
