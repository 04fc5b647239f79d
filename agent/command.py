"""The control plane's answer to this agent's command poll (`GET /api/v1/agents/commands/`, built by
`orchestration.services.agents`), typed: what this node should do now. It is read from the wire
once (`AgentCommand.from_dict`), where a missing, unknown-typed or mistyped field is a
`CommandError` naming it (an agent and a control plane of different versions fail there, plainly,
not on a key deep in the agent); the agent and its supervisor read attributes from then on.

The generation's `layout` stays the published dict here: its reader is the worker, which checks it
field by field (`runtime.distributed.published_layout.PublishedLayout.from_dict`). The SPEC and
CONTROL files the supervisor writes for the worker are `CommandJob.to_dict()` and
`CommandGeneration.to_dict()`: the wire's own fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

ACTIONS = ("idle", "stop", "profile", "prepare", "run", "standby")
"""What an answer may tell the agent (the control plane's API schema takes them from here): `run` (a
member of the current generation), `standby` (the job has a generation without this node),
`profile` / `prepare` (the job's first steps on its nodes), `stop` (the instance or its job has
ended), `idle` (nothing for this node)."""

# Which parts each action needs; a part an action does not need may still come (e.g. `stop` names
# the ended job).
_NEEDS = {"run": ("job", "generation", "assignment"), "standby": ("job",), "profile": ("job",),
          "prepare": ("job",)}


class CommandError(ValueError):
    """The control plane's answer is not a command this agent can read; `field` names the part."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"agent command: {field}: {message}")
        self.field = field


def _get(wire: Mapping[str, Any], name: str, kind: type | tuple[type, ...], path: str) -> Any:
    if name not in wire:
        raise CommandError("missing", field=f"{path}{name}")
    value, kinds = wire[name], kind if isinstance(kind, tuple) else (kind,)
    # bool is an int to isinstance: an id or a count of `true` is a mistake on the wire.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(k.__name__ for k in kinds)
        raise CommandError(f"expected {expected}, got {value!r}"[:200], field=f"{path}{name}")
    return value


def _object(wire: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(wire, Mapping):
        raise CommandError(f"expected a JSON object, got {type(wire).__name__}", field=path or "(command)")
    return wire


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandJob:
    """The job this node serves, as the control plane has it now."""

    id: int
    status: str
    strategy: str
    target_steps: int
    config: dict[str, Any]
    """The job's contract (`runtime.config.JobConfig.to_dict()`): the worker builds its config from it."""
    plan: dict[str, Any]
    steps_done: int
    artifacts: str
    """The job's folder in the artifact store (the final weights go there)."""

    @classmethod
    def from_dict(cls, wire: Any) -> CommandJob:
        wire = _object(wire, "job")
        return cls(id=_get(wire, "id", int, "job."), status=_get(wire, "status", str, "job."),
                   strategy=_get(wire, "strategy", str, "job."), target_steps=_get(wire, "target_steps", int, "job."),
                   config=dict(_get(wire, "config", dict, "job.")), plan=dict(_get(wire, "plan", dict, "job.")),
                   steps_done=_get(wire, "steps_done", int, "job."), artifacts=_get(wire, "artifacts", str, "job."))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandGeneration:
    """The job's current generation: its number, members and published layout."""

    number: int
    membership: list[dict[str, Any]]
    layout: dict[str, Any]
    created_at: str

    @classmethod
    def from_dict(cls, wire: Any) -> CommandGeneration:
        wire = _object(wire, "generation")
        membership = _get(wire, "membership", list, "generation.")
        for index, member in enumerate(membership):
            _object(member, f"generation.membership[{index}]")
        return cls(number=_get(wire, "number", int, "generation."), membership=[dict(m) for m in membership],
                   layout=dict(_get(wire, "layout", dict, "generation.")),
                   created_at=_get(wire, "created_at", str, "generation."))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentCommand:
    """One answer to the command poll."""

    version: str
    """Changes whenever what this node should do may have changed: the agent's next poll sends it."""
    instance: int
    provider_instance_id: str | None
    """None only for an instance not attached to a provider VM yet (the model allows it)."""
    action: str
    job: CommandJob | None = None
    generation: CommandGeneration | None = None
    assignment: dict[str, Any] | None = None
    """This node's member entry in the generation (`run` only): its instance and runtime node."""

    @property
    def generation_number(self) -> int | None:
        return self.generation.number if self.generation is not None else None

    @classmethod
    def from_dict(cls, wire: Any) -> AgentCommand:
        """The command `wire` holds; `CommandError` naming the first missing or mistyped field."""
        wire = _object(wire, "")
        action = _get(wire, "action", str, "")
        if action not in ACTIONS:
            raise CommandError(f"unknown action {action!r}; expected one of {ACTIONS}", field="action")
        for part in _NEEDS.get(action, ()):
            if wire.get(part) is None:
                raise CommandError(f"missing: a {action!r} command names its {part}", field=part)
        assignment = wire.get("assignment")
        if assignment is not None:
            _object(assignment, "assignment")
            _get(assignment, "node", int, "assignment.")
        return cls(
            version=_get(wire, "version", str, ""), instance=_get(wire, "instance", int, ""),
            provider_instance_id=_get(wire, "provider_instance_id", (str, type(None)), ""), action=action,
            job=None if wire.get("job") is None else CommandJob.from_dict(wire["job"]),
            generation=None if wire.get("generation") is None else CommandGeneration.from_dict(wire["generation"]),
            assignment=None if assignment is None else dict(assignment),
        )
