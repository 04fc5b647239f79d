"""The demo's process hygiene: a marked process is found and ended wherever it went, its parents never."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from spotpipe.demo import processes


def test_sweep_ends_marked_processes_in_their_own_sessions_and_spares_the_rest(tmp_path):
    var_dir = tmp_path / "var"
    marked_env = {**os.environ, processes.MARK: str(var_dir.resolve())}
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    # One in a session of its own (as the local provider's nodes are), one ignoring SIGTERM.
    detached = subprocess.Popen(sleeper, env=marked_env, start_new_session=True)
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); time.sleep(60)"], env=marked_env)
    unmarked = subprocess.Popen(sleeper)
    try:
        deadline = time.monotonic() + 10
        while len(processes.stray_pids(var_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes.stray_pids(var_dir) == sorted([detached.pid, stubborn.pid])
        ended = processes.sweep(var_dir, grace_s=0.5)
        assert sorted(ended) == sorted([detached.pid, stubborn.pid])
        assert detached.wait(timeout=5) != 0 and stubborn.wait(timeout=5) != 0
        assert processes.stray_pids(var_dir) == []
        assert unmarked.poll() is None
    finally:
        for proc in (detached, stubborn, unmarked):
            proc.kill()
            proc.wait(timeout=5)


def test_the_demo_itself_and_its_parents_are_never_swept(tmp_path, monkeypatch):
    var_dir = tmp_path / "var"
    # A demo started with the mark already in its environment (a nested run) must not kill itself.
    script = (f"import os, sys; os.environ[{processes.MARK!r}] = {str(var_dir.resolve())!r}; "
              "from spotpipe.demo.processes import stray_pids; print(stray_pids(sys.argv[1]))")
    env = {**os.environ, processes.MARK: str(var_dir.resolve())}
    out = subprocess.run([sys.executable, "-c", script, str(var_dir)], env=env, capture_output=True, text=True,
                         cwd=processes.REPO_ROOT, check=True, timeout=30)
    assert out.stdout.strip() == "[]"
