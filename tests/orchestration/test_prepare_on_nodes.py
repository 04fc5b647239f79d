"""The nodes' side of a job's prepare step (`config.data.prepare`, issue 41; the control plane's side
is tests/controlplane/test_prepare_step.py): agents told `prepare` claim shares one after another in a
thread of their own, run `python -m runtime.data.prepare_share` in the job's environment and report
each share; together they write the corpus one machine's prepare writes. Data that cannot be
prepared is reported once as `prepare_failed`; a stopped share's process is killed."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

from agent.command import AgentCommand
from agent.main import Agent, AgentConfig
from agent.prepare import run_share
from runtime.config import DataSpec, JobConfig
from runtime.data.prepare import prepare
from tests.orchestration.agent_commands import agent_command
from tests.runtime.data.test_shards import stream_tokens, write_corpus


class _Shares:
    """The control plane's share pool as `controlplane.jobs.prepare_step` keeps it (the lowest free
    share first), shared by the agents' fake clients."""

    def __init__(self, count: int, *, source: str, out: str) -> None:
        self.free, self.count = list(range(count)), count
        self.source, self.out = source, out
        self.reports: list[dict] = []
        self.lock = threading.Lock()

    def claim(self) -> dict:
        with self.lock:
            if self.free:
                return {"state": "assigned", "share": self.free.pop(0), "of": self.count, "source": self.source,
                        "tokenizer": "byte", "out": self.out}
            return {"state": "prepared" if len(self.reports) == self.count else "waiting", "share": None}


class _Client:
    def __init__(self, shares: _Shares) -> None:
        self.shares, self.events = shares, []

    def prepare_claim(self) -> dict:
        return self.shares.claim()

    def prepare_done(self, **report) -> None:
        with self.shares.lock:
            self.shares.reports.append(report)

    def event(self, **event) -> None:
        self.events.append(event)


def _command(source: str, out: str) -> AgentCommand:
    config = JobConfig(dp=2, pp=1, data=DataSpec(source=source, prepare=out)).to_dict()
    return agent_command("prepare", job_id=7, status="provisioning", config=config)


def _agent(tmp_path: Path, name: str, shares: _Shares) -> Agent:
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path / name, address="127.0.0.1",
                              prepare_workers=1, prepare_poll_s=0.2))
    agent.client = _Client(shares)
    return agent


def _wait_for_threads(agents: list[Agent], timeout_s: float = 120.0) -> None:
    for agent in agents:
        assert agent._preparing is not None
        agent._preparing[1].join(timeout_s)
        assert not agent._preparing[1].is_alive(), "the agent's prepare thread did not end"


def test_two_agents_prepare_three_shares_into_the_corpus_one_prepare_makes(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus", count=6)
    source, out = f"text:{tmp_path / 'corpus'}", str(tmp_path / "prepared")
    shares = _Shares(3, source=source, out=out)
    agents = [_agent(tmp_path, name, shares) for name in ("a", "b")]
    for agent in agents:
        agent._apply(_command(source, out))
        agent._apply(_command(source, out))  # the same command again: one thread per job
    _wait_for_threads(agents)
    assert sorted(r["share"] for r in shares.reports) == [0, 1, 2]
    assert sum(r["index_written"] for r in shares.reports) >= 1 and sum(r["files"] for r in shares.reports) == 6
    prepare(source, tokenizer="byte", out=str(tmp_path / "whole"), stream=io.StringIO())
    assert (stream_tokens(out) == stream_tokens(str(tmp_path / "whole"))).all()
    assert not any(agent.client.events for agent in agents)


def test_data_that_cannot_be_prepared_is_reported_once(tmp_path: Path) -> None:
    source, out = f"text:{tmp_path / 'no-such-corpus'}", str(tmp_path / "prepared")
    shares = _Shares(2, source=source, out=out)
    agent = _agent(tmp_path, "a", shares)
    agent._apply(_command(source, out))
    _wait_for_threads([agent])
    assert [e["kind"] for e in agent.client.events] == ["prepare_failed"]
    assert "no-such-corpus" in agent.client.events[0]["message"] and not shares.reports


def test_a_stopped_share_is_killed_and_reports_nothing(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus", count=2)
    stop = threading.Event()
    stop.set()
    claim = {"share": 0, "of": 1, "source": f"text:{tmp_path / 'corpus'}", "tokenizer": "byte",
             "out": str(tmp_path / "prepared")}
    assert run_share(sys.executable, claim, stop=stop, on_line=lambda line: None, workers=1) == {}
    assert not (tmp_path / "prepared" / "index.json").exists()
