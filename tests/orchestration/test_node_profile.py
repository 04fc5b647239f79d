"""The first node's side of `plan: auto` for a model function sent without its measures (issue 40,
item 7; the control plane's side is tests/controlplane/test_profile_first.py): the agent, told to
`profile`, runs `python -m runtime.train.node_profile` in the job's environment, on the job's data,
and sends what `spotpipe submit` would have recorded (the layer count, each layer's measures, the
per-layer times); a model that cannot run is reported once as `profile_failed`, with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.main import Agent, AgentConfig
from agent.profile import ProfileFailed, run_node_profile
from runtime.config import DataSpec, JobConfig, ModelSpec
from runtime.train.model_check import validate_model
from tests.orchestration.agent_commands import agent_command

M = "tests.usermodels.models"
ROOT = Path(__file__).resolve().parents[2]


def _config(path: str = f"{M}:cnn") -> JobConfig:
    return JobConfig(model=ModelSpec(kind="py", path=path), dp=1, pp=1, microbatches=1, global_batch=4,
                     data=DataSpec(source=f"py:{M}:images"))


def test_the_node_profile_is_what_submit_would_have_recorded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # where the job's code is, as for the worker the agent starts
    profile = run_node_profile(sys.executable, _config().to_dict(), work_dir=tmp_path)
    expected = validate_model(_config(), profile=False)
    assert profile["layers"] == expected.num_layers == 4
    assert [m["parameters"] for m in profile["layer_measures"]] == [m.parameters for m in expected.measures]
    assert [m["forward_flops"] for m in profile["layer_measures"]] == [m.forward_flops for m in expected.measures]
    assert len(profile["layer_costs"]) == 4 and all(c > 0 for c in profile["layer_costs"])


def test_a_model_that_cannot_run_is_a_reason_not_a_crash(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(ProfileFailed, match="returns_dict"):
        run_node_profile(sys.executable, _config(f"{M}:returns_dict").to_dict(), work_dir=tmp_path)


class _Recorder:
    """The agent's control-plane client, recording what it sends."""

    def __init__(self) -> None:
        self.profiles: list[dict] = []
        self.events: list[dict] = []

    def profile(self, **profile) -> None:
        self.profiles.append(profile)

    def event(self, **event) -> None:
        self.events.append(event)


@pytest.mark.parametrize("path,profiled", [(f"{M}:cnn", True), (f"{M}:returns_dict", False)])
def test_the_agent_profiles_once_when_told_to(tmp_path: Path, monkeypatch, path: str, profiled: bool) -> None:
    monkeypatch.chdir(ROOT)
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path, address="127.0.0.1"))
    agent.client = recorder = _Recorder()
    command = agent_command("profile", job_id=7, status="provisioning", config=_config(path).to_dict())
    agent._apply(command)
    agent._apply(command)  # a repeated command (a long-poll answered again) profiles once
    if profiled:
        assert len(recorder.profiles) == 1 and recorder.profiles[0]["layers"] == 4 and not recorder.events
    else:
        assert not recorder.profiles and [e["kind"] for e in recorder.events] == ["profile_failed"]
        assert "returns_dict" in recorder.events[0]["message"]
