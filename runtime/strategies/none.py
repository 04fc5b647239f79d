"""`none`: the plain DP x PP pipeline with no fault tolerance (the throughput baseline)."""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Layout, pipelines_layout
from runtime.strategies.base import Slots


class NoneStrategy:
    """Every slot must be filled; any loss is fatal."""

    name = "none"
    decision = "restart"
    restarts_from_checkpoint = False
    falls_back_to_checkpoint = False
    simulated_schedule = "1f1b"
    plans_from_count = False
    plans_per_row = False
    rows_interchangeable = False
    recovery_s = 30.0 + 5.0  # no recovery of its own: the planner prices a loss as a re-instantiation
    batches_joiners = False  # it never runs with an empty slot

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        missing = [(p, s) for p, row in enumerate(slots) for s, n in enumerate(row) if n is None]
        if missing:
            raise LayoutError(
                f"strategy 'none' cannot run with empty slots {missing}; expected all {config.num_nodes}"
            )
        return pipelines_layout(config, [list(row) for row in slots])  # type: ignore[arg-type]
