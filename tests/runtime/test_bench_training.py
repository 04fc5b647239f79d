"""Smoke test of `python -m bench training --quick`: it runs end to end (spotpipe none and recycle
and plain PyTorch, at dp=1 pp=1 and dp=1 pp=2) and writes its figures as JSON with positive values.
The figures themselves (and the 0.9 target) are measured, not asserted: see docs/runtime.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not `integration`: it asserts no figure (they are measured, not asserted), so it needs no machine of
# its own and runs on the xdist workers beside the other `runtime` tests (36 s alone, one at a time).
pytestmark = [pytest.mark.runtime, pytest.mark.timeout(300)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_quick_training_bench_writes_positive_figures(tmp_path: Path) -> None:
    out = tmp_path / "training.json"
    # Run from tmp_path: the bench writes its corpus and plots under ./var/bench/training.
    result = subprocess.run(
        [sys.executable, "-m", "bench", "training", "--quick", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
    )
    output = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, output
    written = json.loads(out.read_text())
    figures = written["training"]
    # Every bench states the machine's plain-Python speed beside its figures (bench/report.py).
    assert written["machine"]["python_loop_ns_per_iteration"] > 0 and written["machine"]["cores"] >= 1
    assert result.stdout.startswith("machine: ")
    for layout in ("dp1_pp1", "dp1_pp2"):
        row = figures[layout]
        for key in ("plain_pytorch_tokens_per_s", "spotpipe_none_tokens_per_s", "spotpipe_recycle_tokens_per_s",
                    "spotpipe_none_ratio", "spotpipe_recycle_ratio"):
            assert row[key] > 0, (layout, key, row)
        assert row["processes"] == row["dp"] * row["pp"]
    assert figures["target_ratio"] == 0.9
    assert figures["setup"]["threads_per_process"] == 1
    assert "html" in figures["plots"]  # the PNG needs kaleido's Chromium; `png_error` says why when missing
    assert "training: gpt-nano tokens/s" in result.stdout
