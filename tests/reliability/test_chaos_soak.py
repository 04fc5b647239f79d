"""The quick chaos soak (`python -m bench chaos --quick`) as CI runs it: its own PostgreSQL and
Redis servers, web server, Celery worker and beat, four local nodes training a job, and one fault
of each kind. The test runs the benchmark as a subprocess and asserts every check of its JSON.

It brings its own servers, so it does not depend on the suite's database or broker: `.ci/run`
runs it once, in the PostgreSQL + Redis pass, and deselects it (`-m "not chaos"`) in the embedded
pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotpipe.demo.processes import stray_pids, sweep

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 280


@pytest.mark.chaos
@pytest.mark.integration
@pytest.mark.timeout(TIMEOUT_S + 20)
def test_quick_chaos_soak_passes_every_check(tmp_path):
    # Under the repository's var/ (not /tmp/pytest-of-root, which the postgres user cannot enter).
    var_dir = REPO_ROOT / "var" / f"chaos-ci-{os.getpid()}"
    out = tmp_path / "chaos.json"
    try:
        try:
            result = subprocess.run(
                [sys.executable, "-m", "bench", "chaos", "--quick", "--seed", "0", "--json", str(out),
                 "--var-dir", str(var_dir)],
                cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            pytest.fail(f"the quick soak did not end within {TIMEOUT_S} s (load {os.getloadavg()}):\n{partial[-6000:]}")
        output = (result.stdout + result.stderr)[-8000:]
        assert out.exists(), f"no JSON written (exit {result.returncode}):\n{output}"
        figures = json.loads(out.read_text())["chaos"]
        failed = [c for c in figures["checks"] if not c["ok"]]
        assert not failed, f"failed checks {failed}:\n{output}"
        assert result.returncode == 0, output
        assert figures["faults_injected"] >= 7
        assert set(figures["faults_by_kind"]) == {"notice", "notice_webhook", "kill", "worker", "redis", "web",
                                                  "postgres"}
        assert figures["lost_notices"] == 0 and figures["double_reconfigurations"] == 0
        assert figures["ledger_gaps"] == 0 and figures["orphans"] == 0 and figures["params_match"] is True
        # Its duration (~150 s on a loaded 2-core machine) is a figure in docs/reliability.md, not asserted here.
    finally:
        left = stray_pids(var_dir)
        sweep(var_dir)
        shutil.rmtree(var_dir, ignore_errors=True)
        assert left == [], f"processes of the soak outlived it: {left}"
