"""The one interface every fault-tolerance strategy implements.

Membership is a grid of *slots*: `slots[p][s]` is the node currently filling stage s of pipeline p of
the full DP x PP layout, or None when that node is gone. A strategy is a pure function from the
slots to the next generation's layout, plus two flags telling the worker how to recover state.
"""

from __future__ import annotations

from typing import Protocol

from runtime.config import JobConfig
from runtime.parallel.layout import Layout

Slots = list[list[int | None]]


class Strategy(Protocol):
    """How a job reshapes itself when nodes leave or join."""

    name: str
    decision: str
    """What the control plane records for a leave this strategy absorbs (`Reconfiguration.decision`)."""
    restarts_from_checkpoint: bool
    """True: after a change, every node reloads the last checkpoint (steps since it are lost)."""
    falls_back_to_checkpoint: bool
    """True: when a change loses every copy of some layer (all holders of a stage at once), the job
    restarts from the last complete checkpoint instead of failing (`membership.make_plan`)."""
    simulated_schedule: str
    """The schedule the simulator runs it with (`runtime/sim/plans.py`)."""
    plans_from_count: bool
    """Its layout depends only on how many nodes are live (it re-chunks `alive_nodes`): the simulator
    keys its plans by that count."""
    plans_per_row: bool
    """Its layout runs every pipeline on its own row of slots, so while no row is empty the layout's
    groups are its distinct rows: the simulator keys its plans by the row patterns that occur."""
    rows_interchangeable: bool
    """Its layout's step does not depend on which pipeline holds which row: the simulator plans a
    state with its rows sorted."""
    recovery_s: float
    """Seconds of progress a preemption costs beyond the step in flight (reaction + detection), as the
    planner prices it (`runtime.planner.search.goodput_fraction`); checkpoint also loses the work since
    its last checkpoint, which the planner adds itself."""
    batches_joiners: bool
    """True: a regroup costs this strategy a restart or a re-instantiation (tens of seconds), so
    joiners that find an empty slot wait for a batch worth it (`membership.joiners_worth_a_regroup`);
    False: its regroup is cheap (a switch into the hole) and every joiner is taken at once."""

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        """The layout for the current slots; raises LayoutError naming what cannot be covered."""
        ...


def full_slots(config: JobConfig) -> Slots:
    """Slots of the failure-free layout: node p * pp + s at (p, s)."""
    return [[p * config.pp + s for s in range(config.pp)] for p in range(config.dp)]


def alive_nodes(slots: Slots) -> list[int]:
    """Nodes filling a slot, in slot order (pipeline-major)."""
    return [n for row in slots for n in row if n is not None]


def fill_slots(slots: Slots, joiners: list[int]) -> tuple[Slots, list[int]]:
    """Put joiners into empty slots (first pipeline, first stage first); returns leftovers."""
    slots = [list(row) for row in slots]
    queue = list(joiners)
    for row in slots:
        for s, node in enumerate(row):
            if node is None and queue:
                row[s] = queue.pop(0)
    return slots, queue
