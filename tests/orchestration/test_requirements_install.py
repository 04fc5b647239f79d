"""A job's requirements on a node (issue 19): the agent installs them with pip into a per-job
virtualenv over the node's environment and starts the runtime on that venv's python; pip's lines go
to the job's events; a requirement that cannot be installed is reported once as `requirements_failed`
(no retry). The wheels are written by hand here: no package index is asked (PIP_NO_INDEX)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from agent.client import ControlPlaneError
from agent.main import Agent, AgentConfig
from agent.requirements import InstallFailed, job_python
from tests.orchestration.agent_commands import agent_command
from tests.runtime.data.conftest import moto_s3, s3  # noqa: F401 (fixtures: moto's S3 server, a bucket)

UNKNOWN = "upload:" + "0" * 64


def make_wheel(folder: Path, *, broken: bool = False) -> Path:
    """A one-module wheel (`spotpipe_tinypkg`, VALUE = 42); `broken`: without its WHEEL/METADATA."""
    dist = "spotpipe_tinypkg-1.0.dist-info"
    files = {"spotpipe_tinypkg/__init__.py": b"VALUE = 42\n"}
    if not broken:
        files[f"{dist}/METADATA"] = b"Metadata-Version: 2.1\nName: spotpipe-tinypkg\nVersion: 1.0\n"
        files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,", ""]).encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spotpipe_tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(autouse=True)
def _no_index(monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")


def _job(job_id: int, requirements: list[str]) -> tuple[int, dict]:
    """A job's id and contract, as `job_python` takes them."""
    return job_id, {"requirements": requirements}


def test_a_job_without_requirements_runs_on_the_agents_python(tmp_path: Path) -> None:
    lines: list[str] = []
    assert job_python(*_job(1, []), work_dir=tmp_path, fetch=lambda e: Path(e), on_line=lines.append) == sys.executable
    assert lines == [] and list(tmp_path.iterdir()) == []


def test_the_worker_starts_on_the_jobs_venv_and_a_failed_install_is_reported_once(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "uploads")
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path / "work", address="127.0.0.1",
                              worker_module="tests.orchestration.requirements_worker"))
    sent: list[dict] = []
    agent.client.event = lambda **fields: sent.append(fields)

    def download(path: str, folder: Path) -> Path:
        if path == f"packages/{'0' * 64}/":
            raise ControlPlaneError(404, {"detail": "No Package matches the given query."})
        return wheel

    agent.client.download = download
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()

    def run(job: tuple[int, dict], generation: int) -> None:
        agent._apply(agent_command("run", job_id=job[0], config=job[1], generation=generation, instance=5,
                                   assignment={"node": 0}))

    run(_job(11, [f"upload:{sha}"]), 1)
    try:
        sample = agent.metrics.get(timeout=30)  # the worker imported the package on the venv's python
        assert sample["loss"] == 42.0
        venv_python = tmp_path / "work" / "job-11" / "venv" / "bin" / "python"
        assert (tmp_path / "work" / "worker-python.txt").read_text() == str(venv_python)
        assert importlib.util.find_spec("spotpipe_tinypkg") is None  # the agent's own environment is untouched
        output = [e["message"] for e in sent if e["kind"] == "requirements_output"]
        assert any("Successfully installed spotpipe-tinypkg-1.0" in line for line in output), output
    finally:
        agent.supervisor.stop()

    # An upload the control plane does not have: reported once, no worker, and not tried again.
    sent.clear()
    run(_job(12, ["numpy>=1", UNKNOWN]), 1)
    run(_job(12, ["numpy>=1", UNKNOWN]), 2)
    assert [e["kind"] for e in sent] == ["requirements_failed"]
    assert sent[0]["generation"] == 1 and "requirements[1]" in sent[0]["message"] and "404" in sent[0]["message"]
    assert not agent.supervisor.running() and not (tmp_path / "work" / "job-12").exists()


def test_a_broken_wheel_fails_with_pips_message_and_the_venv_is_installed_once(tmp_path: Path) -> None:
    broken, good = make_wheel(tmp_path / "broken", broken=True), make_wheel(tmp_path / "good")
    lines: list[str] = []
    with pytest.raises(InstallFailed) as failed:
        job_python(*_job(3, [UNKNOWN]), work_dir=tmp_path, fetch=lambda e: broken, on_line=lines.append)
    assert failed.value.reason.startswith("pip install exited with 1: ERROR:")
    assert "invalid wheel" in failed.value.reason and len(failed.value.reason) < 300
    assert any("invalid wheel" in line for line in lines)

    # Fixed (another list): installed; the same list again reuses the venv without pip.
    python = job_python(*_job(3, [f"upload:{'1' * 64}"]), work_dir=tmp_path, fetch=lambda e: good, on_line=lines.append)
    started = time.monotonic()
    again: list[str] = []
    assert job_python(*_job(3, [f"upload:{'1' * 64}"]), work_dir=tmp_path, fetch=lambda e: good,
                      on_line=again.append) == python
    assert again == [] and time.monotonic() - started < 5
    # torch comes from the node's environment, the package from the venv.
    probe = subprocess.run([python, "-c", "import importlib.util as u, spotpipe_tinypkg; "
                            "print(spotpipe_tinypkg.VALUE, u.find_spec('torch') is not None)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["42", "True"]


def test_an_agent_told_not_to_install_runs_jobs_on_its_own_environment(tmp_path: Path) -> None:
    # `--no-requirements`: nothing installed, and the job's timeline says so.
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path, address="127.0.0.1",
                              install_requirements=False))
    sent: list[dict] = []
    agent.client.event = lambda **fields: sent.append(fields)
    command = agent_command("run", job_id=4, config={"requirements": ["numpy>=1.26"]}, generation=1,
                            assignment={"node": 0})
    assert agent._job_python(command) == sys.executable
    assert [e["kind"] for e in sent] == ["requirements_output"] and "own environment" in sent[0]["message"]
    assert not (tmp_path / "job-4").exists()


def test_an_s3_requirement_is_fetched_with_the_nodes_credentials(s3, tmp_path: Path) -> None:  # noqa: F811
    # pip reads a wheel's tags from its name: the local copy keeps the object's.
    client, bucket = s3
    wheel = make_wheel(tmp_path / "built")
    client.upload_file(str(wheel), bucket, f"pkgs/{wheel.name}")
    agent = Agent(AgentConfig(control_plane="http://127.0.0.1:9", work_dir=tmp_path / "work", address="127.0.0.1"))
    local = agent._fetch_package(f"s3://{bucket}/pkgs/{wheel.name}")
    assert local.name == wheel.name and local.read_bytes() == wheel.read_bytes()
