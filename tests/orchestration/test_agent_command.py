"""The command an agent reads (`agent.command.AgentCommand`): a command from another version of the
control plane, or a broken one, fails where it is read with the field named, and what the agent
writes for its worker (SPEC, CONTROL) is the wire's own fields."""

from __future__ import annotations

import copy

import pytest

from agent.command import AgentCommand, CommandError
from tests.orchestration.agent_commands import agent_command

WIRE = {
    "version": "running:7:2:running", "instance": 3, "provider_instance_id": "i-0abc", "action": "run",
    "job": {"id": 7, "status": "running", "strategy": "recycle", "target_steps": 100, "config": {"dp": 1},
            "plan": {"provider": "local"}, "steps_done": 4, "artifacts": "file:///tmp/a/job-7-0f0f0f0f"},
    "generation": {"number": 2, "membership": [{"instance": 3, "rank": 0, "pipeline": 0, "stage": 0, "node": 0}],
                   "layout": {"strategy": "recycle"}, "created_at": "2026-12-04T10:00:00+00:00"},
    "assignment": {"instance": 3, "rank": 0, "pipeline": 0, "stage": 0, "node": 0},
}


def _broken(path: str, value: object = ...) -> dict:
    """WIRE with the field at dotted `path` set to `value` (left out when `...`)."""
    wire = copy.deepcopy(WIRE)
    *parents, name = path.split(".")
    target = wire
    for part in parents:
        target = target[part]
    if value is ...:
        del target[name]
    else:
        target[name] = value
    return wire


def test_a_whole_answer_reads_and_gives_its_parts_back_unchanged() -> None:
    command = AgentCommand.from_dict(WIRE)
    assert (command.action, command.job.id, command.generation_number, command.assignment["node"]) == ("run", 7, 2, 0)
    assert command.job.to_dict() == WIRE["job"] and command.generation.to_dict() == WIRE["generation"]


@pytest.mark.parametrize("path,value,field,says", [
    ("version", ..., "version", "missing"),
    ("job.artifacts", ..., "job.artifacts", "missing"),  # a control plane older than the artifact store
    ("job.id", "7", "job.id", "expected int"),
    ("job.id", True, "job.id", "expected int"),
    ("job.config", [], "job.config", "expected dict"),
    ("generation.number", None, "generation.number", "expected int"),
    ("generation.membership", [5], "generation.membership[0]", "expected a JSON object"),
    ("assignment.node", ..., "assignment.node", "missing"),
    ("action", "dance", "action", "unknown action 'dance'"),
    ("generation", None, "generation", "a 'run' command names its generation"),
])
def test_a_broken_answer_names_its_field(path: str, value: object, field: str, says: str) -> None:
    with pytest.raises(CommandError) as raised:
        AgentCommand.from_dict(_broken(path, value))
    assert raised.value.field == field and says in str(raised.value)


def test_an_answer_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(CommandError, match=r"\(command\): expected a JSON object, got list"):
        AgentCommand.from_dict([WIRE])


def test_parts_an_action_does_not_need_may_be_absent() -> None:
    idle = AgentCommand.from_dict({**WIRE, "action": "idle", "job": None, "generation": None, "assignment": None})
    assert idle.job is None and idle.generation_number is None
    unattached = AgentCommand.from_dict({**WIRE, "provider_instance_id": None})  # the model allows it
    assert unattached.provider_instance_id is None
    standby = agent_command("standby", generation=3)
    assert standby.assignment is None and standby.generation_number == 3
