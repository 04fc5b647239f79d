"""The client side of the job file: reading it (deadline forms, unknown keys, bad TOML), finding the
control plane (environment, credentials file, profile), and `spotpipe train` on local processes."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotpipe import commands
from spotpipe.client import ClientError, endpoint_from_environment
from spotpipe.jobfile import JobFileError, load_job_file
from spotpipe.train import TrainOptions, run_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("deadline", "expected"),
    [('"90s"', "2026-11-25T12:01:30+00:00"), ('"6h"', "2026-11-25T18:00:00+00:00"),
     ('"2d"', "2026-11-27T12:00:00+00:00"), ("2026-12-01T00:00:00Z", "2026-12-01T00:00:00+00:00"),
     ('"2026-12-01T00:00:00Z"', "2026-12-01T00:00:00Z")],
)
def test_deadline_forms(tmp_path: Path, deadline: str, expected: str) -> None:
    body = load_job_file(_file(tmp_path, f"target_steps = 5\ndeadline = {deadline}\n"), now=NOW)
    assert body["deadline"] == expected
    assert body["name"] == "job"  # the file's name when the file names none


@pytest.mark.parametrize(
    ("text", "message"),
    [("target_steps = \n", "not a TOML file"), ("steps = 5\n", r"unknown key\(s\) steps"),
     ("deadline = 2026-12-01T00:00:00\n", "no time zone"), ("deadline = 5\n", "a time or a duration")],
)
def test_unreadable_job_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(JobFileError, match=message):
        load_job_file(_file(tmp_path, text), now=NOW)


def test_the_examples_read() -> None:
    for path in EXAMPLES.glob("*.toml"):
        body = load_job_file(path, now=NOW)
        assert body["config"]["model"]["kind"] in ("gpt", "mlp") and body["target_steps"] > 0


def test_endpoint_comes_from_the_environment_then_the_credentials_profile(tmp_path: Path) -> None:
    creds = tmp_path / "credentials.toml"
    creds.write_text('[default]\nurl = "http://a:8000/"\ntoken = "t1"\n[ci]\nurl = "http://b"\ntoken = "t2"\n')
    assert endpoint_from_environment({"SPOTPIPE_CONFIG": str(creds)}) == endpoint_from_environment(
        {"SPOTPIPE_URL": "http://a:8000", "SPOTPIPE_TOKEN": "t1"})
    ci = endpoint_from_environment({"SPOTPIPE_CONFIG": str(creds), "SPOTPIPE_PROFILE": "ci"})
    assert (ci.url, ci.token) == ("http://b", "t2")
    with pytest.raises(ClientError, match="no control plane configured"):
        endpoint_from_environment({"SPOTPIPE_CONFIG": str(tmp_path / "none.toml")})


def test_train_refuses_what_it_cannot_run_naming_the_field(tmp_path: Path) -> None:
    err = io.StringIO()
    auto = _file(tmp_path, 'target_steps = 5\n[config.model]\nkind = "mlp"\n[plan]\nauto = true\n')
    assert run_train(TrainOptions(file=auto, out=tmp_path / "out"), out=io.StringIO(), err=err) == 2
    assert "plan.auto needs a control plane" in err.getvalue()
    err = io.StringIO()
    bad = _file(tmp_path, 'target_steps = 5\n[config]\nlr = "x"\n[config.model]\nn_layer = 0\n[plan]\npp = 9\n')
    assert run_train(TrainOptions(file=bad, out=tmp_path / "out"), out=io.StringIO(), err=err) == 2
    assert "error: lr: lr must be a finite number" in err.getvalue()


@pytest.mark.runtime
def test_train_runs_a_job_file_on_local_processes(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = run_train(TrainOptions(file=EXAMPLES / "tiny-mlp.toml", out=tmp_path / "tiny"), out=out, err=err)
    assert code == 0, err.getvalue()
    assert "done: 40 steps" in out.getvalue()
    assert len(list((tmp_path / "tiny" / "ranks").glob("node-*.pt"))) == 4  # dp=2 x pp=2: every node saved its layers
    assert len((tmp_path / "tiny" / "metrics.jsonl").read_text().splitlines()) == 40


def test_every_client_command_says_when_no_control_plane_is_configured(monkeypatch, tmp_path: Path) -> None:
    for name in ("SPOTPIPE_URL", "SPOTPIPE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPOTPIPE_CONFIG", str(tmp_path / "none.toml"))
    job_file = _file(tmp_path, "target_steps = 5\n")
    for call in (lambda err: commands.submit(job_file, err=err), lambda err: commands.jobs(err=err),
                 lambda err: commands.status(1, err=err), lambda err: commands.logs(1, follow=True, err=err),
                 lambda err: commands.cancel(1, err=err), lambda err: commands.resume(1, err=err)):
        err = io.StringIO()
        assert call(err) == 1
        assert "no control plane configured" in err.getvalue()


class _LateCommit:
    """A control plane whose `job_finished` event, stamped before an event `logs --follow` already
    printed, commits with the job's final status after that print (its transaction was still open)."""

    def __init__(self) -> None:
        self.committed = [{"id": 1, "at": "2026-11-25T12:00:01Z", "kind": "generation", "message": "generation 1"},
                          {"id": 3, "at": "2026-11-25T12:00:03Z", "kind": "agent_worker_exit", "message": "exited"}]
        self.polls = 0

    def events(self, job_id: int, *, since: str | None = None) -> list[dict]:
        return sorted((e for e in self.committed if since is None or e["at"] >= since), key=lambda e: e["at"])

    def job(self, job_id: int) -> dict:
        self.polls += 1
        if self.polls == 1:
            return {"steps_done": 5, "target_steps": 10, "status": "running"}
        self.committed.append({"id": 2, "at": "2026-11-25T12:00:02Z", "kind": "job_finished",
                               "message": "finished 10 steps"})
        return {"steps_done": 10, "target_steps": 10, "status": "finished"}


def test_follow_prints_an_event_that_committed_after_a_later_stamped_one(monkeypatch) -> None:
    monkeypatch.setattr(commands, "_client", _LateCommit)
    monkeypatch.setattr(commands, "FOLLOW_POLL_S", 0.0)
    out = io.StringIO()
    assert commands.logs(7, follow=True, out=out) == 0
    printed = [line.split()[1] for line in out.getvalue().splitlines() if not line.startswith("--")]
    assert sorted(printed) == ["agent_worker_exit", "generation", "job_finished"]  # each once


def test_a_slow_server_is_reported_as_slow_and_an_absent_one_as_unreachable(monkeypatch) -> None:
    import socket

    from spotpipe import client as client_module
    from spotpipe.client import Client, Endpoint

    monkeypatch.setattr(client_module, "TIMEOUT_S", 0.5)
    with socket.socket() as silent:  # accepts the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ClientError, match=r"did not answer within 0.5 s \(the control plane is slow or busy\)"):
            Client(Endpoint(url=url, token="t")).jobs()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: the connection is refused
        with pytest.raises(ClientError, match=f"cannot reach http://127.0.0.1:{port}"):
            Client(Endpoint(url=f"http://127.0.0.1:{port}", token="t")).jobs()


def test_a_duration_deadline_counts_from_the_request_not_from_reading_the_file(tmp_path: Path, monkeypatch) -> None:
    import time
    from datetime import datetime as dt
    from datetime import timedelta

    sent = []

    class Client:
        def submit(self, body):
            sent.append((dt.now(UTC), body))
            return {"id": 1, "name": "x", "status": "pending", "plan": {}}

    def slow_checks(body):  # a user model's import, dry run and profile on a loaded machine
        time.sleep(1.0)
        return body

    monkeypatch.setattr(commands, "_client", Client)
    monkeypatch.setattr(commands, "describe_plan", lambda plan: "")
    monkeypatch.setattr(commands, "validate_user_model", slow_checks)
    began = dt.now(UTC)
    assert commands.submit(_file(tmp_path, 'target_steps = 5\ndeadline = "2s"\n'), out=io.StringIO()) == 0
    (at, body), = sent
    deadline = dt.fromisoformat(body["deadline"])
    assert deadline - at <= timedelta(seconds=2)  # 2 s from the request
    assert (deadline - began).total_seconds() >= 2.9  # not from reading the file, a second earlier
    # A malformed deadline still fails when the file is read, before any check runs.
    with pytest.raises(JobFileError, match="a time or a duration"):
        load_job_file(_file(tmp_path, "deadline = 5\n"), at_send=True)
