"""`checkpoint`: periodic checkpoints; after any change, restart from the last one.

The baseline: survivors (and replacements) regroup into as many full pipelines as they can fill,
reload the last complete checkpoint and replay the steps since. The interval comes from
Young/Daly, sqrt(2 * checkpoint cost * MTBF), turned into steps.
"""

from __future__ import annotations

import math

from runtime.config import JobConfig, LayoutError
from runtime.layout import Layout, pipelines_layout
from runtime.strategies.base import Slots, alive_nodes


def young_daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Optimal seconds between checkpoints (Young 1974, Daly 2006 first order)."""
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def checkpoint_interval_steps(config: JobConfig) -> int:
    """Steps between checkpoints: the configured value, or Young/Daly from the observed rates."""
    if config.checkpoint_interval > 0:
        return config.checkpoint_interval
    period = young_daly_interval_s(config.checkpoint_cost_s, config.mtbf_s)
    return max(1, round(period / max(config.step_time_s, 1e-9)))


class CheckpointStrategy:
    """Full pipelines only; state always comes back from the checkpoint."""

    name = "checkpoint"
    restarts_from_checkpoint = True

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        nodes = alive_nodes(slots)
        full = len(nodes) // config.pp
        if full < 1:
            raise LayoutError(
                f"{len(nodes)} nodes cannot fill one pipeline; expected at least pp={config.pp}"
            )
        pipes = [nodes[i * config.pp : (i + 1) * config.pp] for i in range(full)]
        return pipelines_layout(config, pipes, standby=tuple(nodes[full * config.pp :]))
