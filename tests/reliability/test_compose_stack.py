"""docker-compose.yml keeps the agents on a web server of their own (docs/orchestration.md, "The
agent channel's own server"): nodes are pointed at it, it runs the web server's application with
the web server's flags but `AGENT_SERVER_WORKERS` workers, and Django accepts its host name. Nothing
here starts docker: the file is the deployment, and these are the rules it must keep."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from spotpipe.demo.processes import AGENT_SERVER_WORKERS

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _granian(command: str) -> list[str]:
    """The granian argument list of a service's command (web's runs after its migrations, in sh -c)."""
    args = shlex.split(command)
    if args[:2] == ["sh", "-c"]:
        args = shlex.split(args[2].split("&&")[-1])
    assert args[:3] == ["python", "-m", "granian"], command
    return args[3:]


def _without_workers(args: list[str]) -> tuple[list[str], int]:
    at = args.index("--workers")
    return args[:at] + args[at + 2:], int(args[at + 1])


def test_nodes_reach_the_control_plane_at_the_agents_server():
    services = _services()
    url = urlsplit(services["worker"]["environment"]["SPOTPIPE_PUBLIC_URL"])
    assert url.hostname == "agents"
    agents = _granian(services["agents"]["command"])
    assert url.port == int(agents[agents.index("--port") + 1])
    allowed = re.fullmatch(r"\$\{ALLOWED_HOSTS:-(.*)\}", services["agents"]["environment"]["ALLOWED_HOSTS"])
    assert allowed is not None and "agents" in allowed.group(1).split(",")


def test_the_agents_server_is_the_web_servers_application_with_its_own_workers():
    services = _services()
    web, web_workers = _without_workers(_granian(services["web"]["command"]))
    agents, agent_workers = _without_workers(_granian(services["agents"]["command"]))
    assert agents == web and agents[-1] == "controlplane.asgi:application"
    assert agent_workers == AGENT_SERVER_WORKERS and web_workers >= 1
    # Both depend on the database and Redis being up; migrations stay web's alone.
    assert {"postgres", "redis"} <= set(services["agents"]["depends_on"])
    assert "migrate" not in services["agents"]["command"] and "migrate" in services["web"]["command"]
