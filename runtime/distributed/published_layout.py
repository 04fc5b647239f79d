"""What the control plane publishes with each generation of a job (`JobGeneration.layout`) and the
node agents and their workers read: the grid of instances, the runtime node id of each, and the
store the workers meet at. One typed value (`PublishedLayout`) for the writer and every reader; a
layout read from the wire or a row is checked field by field (`PlanWireError` names the field).

The runtime's own plan of the generation (who trains which layers, from which step) is the
workers' to agree on (`runtime.distributed.generation_plan`); this is only where they start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from runtime.distributed.generation_plan import PlanWireError, Slots


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedLayout:
    """One generation as the control plane published it."""

    strategy: str
    dp: int
    pp: int
    slots: Slots
    """`slots[p][s]`: the instance (control-plane id) filling stage s of pipeline p, or None."""
    decision: str
    """What made this generation: `start`, `grow`, `restart`, or the strategy's reaction to a loss."""
    restart_from_checkpoint: bool = False
    holes: list[tuple[int, int]] = field(default_factory=list)
    """(pipeline, stage) of each empty slot."""
    nodes: list[tuple[int, int]] = field(default_factory=list)
    """(instance id, runtime node id) of every slotted instance."""
    rendezvous: str = ""
    """`host:port` of the job's store."""

    @property
    def initial_nodes(self) -> int:
        """Nodes of the full layout: a runtime node id from here on is a replacement's."""
        return self.dp * self.pp

    def node_ids(self) -> dict[int, int]:
        """Instance id -> runtime node id."""
        return dict(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy, "dp": self.dp, "pp": self.pp, "slots": [list(row) for row in self.slots],
            "decision": self.decision, "restart_from_checkpoint": self.restart_from_checkpoint,
            "holes": [list(h) for h in self.holes], "nodes": [list(n) for n in self.nodes],
            "rendezvous": self.rendezvous,
        }

    @classmethod
    def from_dict(cls, wire: Any) -> PublishedLayout:
        """The layout `wire` holds; `PlanWireError` naming the first unknown, missing or mistyped field."""
        if not isinstance(wire, Mapping):
            raise PlanWireError(f"expected a JSON object, got {type(wire).__name__}", field="(layout)")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(wire) - names)
        if unknown:
            raise PlanWireError(f"unknown field of a published layout; expected one of {sorted(names)}",
                                field=f"layout.{unknown[0]}")
        for name in ("strategy", "dp", "pp", "slots", "decision"):
            if name not in wire:
                raise PlanWireError("missing", field=f"layout.{name}")
        return cls(
            strategy=_text(wire, "strategy"), dp=_count(wire, "dp"), pp=_count(wire, "pp"), slots=_slots(wire),
            decision=_text(wire, "decision"), restart_from_checkpoint=_flag(wire, "restart_from_checkpoint"),
            holes=_pairs(wire, "holes"), nodes=_pairs(wire, "nodes"), rendezvous=_text(wire, "rendezvous", ""),
        )


def _text(wire: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = wire.get(name, default)
    if not isinstance(value, str):
        raise PlanWireError(f"expected a string, got {value!r}", field=f"layout.{name}")
    return value


def _count(wire: Mapping[str, Any], name: str) -> int:
    value = wire[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanWireError(f"expected a positive integer, got {value!r}", field=f"layout.{name}")
    return value


def _flag(wire: Mapping[str, Any], name: str) -> bool:
    value = wire.get(name, False)
    if not isinstance(value, bool):
        raise PlanWireError(f"expected true or false, got {value!r}", field=f"layout.{name}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _slots(wire: Mapping[str, Any]) -> Slots:
    value = wire["slots"]
    if not isinstance(value, list) or not all(
            isinstance(row, list) and all(n is None or _is_int(n) for n in row) for row in value):
        raise PlanWireError(f"expected rows of instance ids or null, got {value!r}", field="layout.slots")
    return [list(row) for row in value]


def _pairs(wire: Mapping[str, Any], name: str) -> list[tuple[int, int]]:
    value = wire.get(name, [])
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and _is_int(p[1]) for p in value):
        raise PlanWireError(f"expected a list of [integer, integer], got {value!r}", field=f"layout.{name}")
    return [(p[0], p[1]) for p in value]
