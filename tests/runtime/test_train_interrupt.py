"""Ctrl-C of `spotpipe train`, as a terminal sends it (SIGINT to the whole process group), at start-up
and while training: one line, no traceback, exit status 130, and no process the command started left
running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.orchestration.providers.local.provider import group_pids
from tests.runtime.test_train_command import CORPUS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.runtime
@pytest.mark.timeout(240)
@pytest.mark.parametrize("when", ["start-up", "training"])
def test_ctrl_c_stops_every_process_with_one_line(tmp_path: Path, when: str) -> None:
    command = [sys.executable, "-m", "spotpipe.cli", "train", "--data", f"text:{CORPUS}", "--dp", "2", "--pp", "2",
               "--microbatches", "2", "--global-batch", "8", "--steps", "100000", "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a terminal's foreground job
    try:
        expected = "training gpt" if when == "start-up" else "step "
        seen = ""
        deadline = time.monotonic() + 180
        while expected not in seen:
            assert time.monotonic() < deadline, f"no {expected!r} line: {seen}"
            line = proc.stdout.readline()
            assert line or proc.poll() is None, f"it exited first: {seen}{proc.stderr.read()}"
            seen += line
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out, err
    assert err.count("interrupted") == 1, err
    deadline = time.monotonic() + 30  # ranks killed by the launcher are reaped by their forkserver
    while group_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_pids(proc.pid) == [], "processes of the command are still running"
