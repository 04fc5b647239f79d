"""SIGTERM in the middle of a demo (Ctrl-C, `docker stop`, a CI timeout) ends everything the demo
started: the web server, worker and beat, the nodes with their agents and runtime workers, and the
job's rendezvous store."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from spotpipe.demo.processes import stray_pids
from tests.demo.test_demo_headless import DemoDatabase, _free_port, _spotpipe, demo_env


@pytest.mark.integration
@pytest.mark.demo
@pytest.mark.timeout(150)
def test_sigterm_mid_training_leaves_no_process_behind(tmp_path):
    var_dir = tmp_path / "var"
    db = DemoDatabase(var_dir)
    env = demo_env(var_dir, db, redis_db=10 + (os.getpid() + 3) % 6)
    db.create()
    demo = None
    try:
        demo = subprocess.Popen([*_spotpipe(), "demo", "--duration", "300", "--port", str(_free_port())], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        seen = []
        deadline = time.monotonic() + 100
        assert demo.stdout is not None
        for line in demo.stdout:
            seen.append(line)
            if "running: generation 1" in line or time.monotonic() > deadline:
                break
        assert any("running: generation 1" in line for line in seen), "".join(seen[-30:])
        nodes = [p for p in (var_dir / "nodes").glob("*/*") if (p / "node.json").exists()]
        assert len(nodes) == 4
        assert stray_pids(var_dir), "the demo's processes should be running now"

        demo.send_signal(signal.SIGTERM)
        rest, _ = demo.communicate(timeout=40)
        assert "stopping" in rest and "everything stopped" in rest, rest[-3000:]
        assert stray_pids(var_dir) == []
        leftovers = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(var_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    leftovers.append(entry.name)
            except OSError:
                continue
        assert leftovers == []
    finally:
        if demo is not None and demo.poll() is None:
            demo.kill()
            demo.wait(timeout=10)
        for pid in stray_pids(var_dir):
            os.kill(pid, 9)
        db.drop()
