"""Commands as the control plane answers them (`orchestration.services.agents`), for tests that hand
an agent, its supervisor or its worker a command without a control plane: every field the agent
reads is there, with neutral values unless a test names them."""

from __future__ import annotations

from typing import Any

from agent.command import AgentCommand


def wire_job(job_id: int = 7, *, config: dict[str, Any] | None = None, status: str = "running",
             target_steps: int = 1) -> dict[str, Any]:
    """A command's `job` part (also the worker's SPEC `job`)."""
    return {"id": job_id, "status": status, "strategy": "none", "target_steps": target_steps,
            "config": config or {}, "plan": {}, "steps_done": 0, "artifacts": ""}


def wire_generation(number: int, *, membership: list[dict[str, Any]] | None = None,
                    layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """A command's `generation` part (also the worker's CONTROL file)."""
    return {"number": number, "membership": membership or [], "layout": layout or {}, "created_at": ""}


def agent_command(action: str, *, job_id: int = 7, config: dict[str, Any] | None = None, status: str = "running",
                  target_steps: int = 1, generation: int | None = None, layout: dict[str, Any] | None = None,
                  membership: list[dict[str, Any]] | None = None, assignment: dict[str, Any] | None = None,
                  instance: int = 1, version: str = "v1") -> AgentCommand:
    """The typed command: `generation` is its number (None: no generation yet)."""
    job = wire_job(job_id, config=config, status=status, target_steps=target_steps)
    wire = None if generation is None else wire_generation(generation, membership=membership, layout=layout)
    return AgentCommand.from_dict({"version": version, "instance": instance, "provider_instance_id": f"i-{instance}",
                                   "action": action, "job": job, "generation": wire, "assignment": assignment})
