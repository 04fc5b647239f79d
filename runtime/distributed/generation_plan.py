"""The plan of one generation, as the members agree on it: a typed value (`GenerationPlan`) and its
wire form (`to_dict` / `from_dict`, JSON in the job's store). One member computes it
(`membership.make_plan`), publishes it once, and every member reads the same plan back; the
control plane asks the same function (`membership.plan_for_fleet`). A plan read from the wire is
checked field by field: an unknown, missing or mistyped field is a `PlanWireError` naming it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.parallel.layout import Layout

Slots = list[list[int | None]]


class PlanWireError(ValueError):
    """A generation plan on the wire that is not one: `field` names what is wrong."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"generation plan: {field}: {message}")
        self.field = field


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationPlan:
    """What generation `generation` runs: who is in it, from which step, which layer states move
    where. Exactly one of three kinds: a layout to run (`layout` set), a wait for replacements
    (`waiting`: a strategy that restarts from its checkpoint has too few members), or the end of the
    job (`error`: its state is lost)."""

    generation: int
    slots: Slots
    """`slots[p][s]`: the node filling stage s of pipeline p of the full layout, or None (a hole)."""
    layout: Layout | None = None
    members: list[int] = field(default_factory=list)
    start_step: int | None = None
    """The step the generation resumes from (None only in an `error` plan)."""
    restore_step: int | None = None
    """Set when every member loads its layers from the checkpoint of that step."""
    transfers: list[tuple[int, int, int]] = field(default_factory=list)
    """(layer, source node, destination node): the hand-over before the first step."""
    leaving: list[int] = field(default_factory=list)
    """Noticed nodes that hand over (if they are sources) and leave."""
    deferred: list[int] = field(default_factory=list)
    """Noticed nodes the job cannot do without yet: members until a replacement joins."""
    lost: list[int] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    spare: list[int] = field(default_factory=list)
    """Joiners with no slot: they stand by outside the group for a later plan."""
    joins_consumed: int = 0
    """Join requests dealt with up to this plan (the next plan's joiners are the ones after)."""
    reason: str = ""
    waiting: str | None = None
    error: str | None = None
    skipped_at: list[int] | None = None
    """The job's steps before `start_step` skipped for a non-finite gradient (fp16's loss scale)."""
    # When to checkpoint (`runtime.checkpointing.durability`), carried from generation to generation.
    checkpoint_every: int = 0
    failures: int = 0
    started_at: float = 0.0
    mtbf_s: float | None = None

    @property
    def runs(self) -> bool:
        """Whether this plan has a layout to train on (neither waiting nor the job's end)."""
        return self.layout is not None and self.waiting is None and self.error is None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready wire form (fields left at their "absent" value are left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _ABSENT_WHEN_NONE:
                continue
            if f.name == "layout":
                value = value.to_dict() if value is not None else None
            elif f.name == "transfers":
                value = [list(t) for t in value]
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, wire: Any) -> GenerationPlan:
        """The plan `wire` (a `to_dict`, JSON-decoded) holds; `PlanWireError` naming the first field
        that is unknown, missing or of the wrong type."""
        if not isinstance(wire, Mapping):
            raise PlanWireError(f"expected a JSON object, got {type(wire).__name__}", field="(plan)")
        unknown = sorted(set(wire) - set(_READERS))
        if unknown:
            raise PlanWireError(f"unknown field; expected one of {sorted(_READERS)}", field=str(unknown[0]))
        for name in ("generation", "slots"):
            if name not in wire:
                raise PlanWireError("missing", field=name)
        return cls(**{name: _READERS[name](name, value) for name, value in wire.items()})


_ABSENT_WHEN_NONE = frozenset({"layout", "start_step", "waiting", "error", "skipped_at", "mtbf_s"})


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanWireError(f"expected an integer, got {value!r}", field=name)
    return value


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else _int(name, value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanWireError(f"expected a number, got {value!r}", field=name)
    return float(value)


def _optional_number(name: str, value: Any) -> float | None:
    return None if value is None else _number(name, value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise PlanWireError(f"expected a string, got {value!r}", field=name)
    return value


def _optional_text(name: str, value: Any) -> str | None:
    return None if value is None else _text(name, value)


def _ints(name: str, value: Any) -> list[int]:
    if not isinstance(value, list):
        raise PlanWireError(f"expected a list of integers, got {value!r}", field=name)
    return [_int(name, v) for v in value]


def _optional_ints(name: str, value: Any) -> list[int] | None:
    return None if value is None else _ints(name, value)


def _slots(name: str, value: Any) -> Slots:
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise PlanWireError(f"expected a list of rows of node ids, got {value!r}", field=name)
    return [[None if n is None else _int(name, n) for n in row] for row in value]


def _transfers(name: str, value: Any) -> list[tuple[int, int, int]]:
    if not isinstance(value, list) or not all(isinstance(t, list) and len(t) == 3 for t in value):
        raise PlanWireError(f"expected a list of [layer, source, destination], got {value!r}", field=name)
    return [(_int(name, t[0]), _int(name, t[1]), _int(name, t[2])) for t in value]


def _layout(name: str, value: Any) -> Layout | None:
    if value is None:
        return None
    try:
        return Layout.from_dict(value)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise PlanWireError(f"not a layout ({type(exc).__name__}: {exc})", field=name) from None


_READERS = {
    "generation": _int, "slots": _slots, "layout": _layout, "members": _ints, "start_step": _optional_int,
    "restore_step": _optional_int, "transfers": _transfers, "leaving": _ints, "deferred": _ints, "lost": _ints,
    "joined": _ints, "spare": _ints, "joins_consumed": _int, "reason": _text, "waiting": _optional_text,
    "error": _optional_text, "skipped_at": _optional_ints, "checkpoint_every": _int, "failures": _int,
    "started_at": _number, "mtbf_s": _optional_number,
}
