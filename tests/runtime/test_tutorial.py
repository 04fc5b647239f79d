"""docs/tutorial.md, run as written: its model file saved, then every line of its `sh` blocks run in
a fresh folder (`spotpipe` and `python` are this interpreter). The control-plane part (a `toml` and a
plain block) is run by the scenario tests the tutorial names."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def _argv(line: str) -> list[str]:
    words = shlex.split(line)
    if words[0] == "spotpipe":
        return [sys.executable, "-m", "spotpipe.cli", *words[1:]]
    assert words[0] == "python", f"the tutorial runs spotpipe and python only: {line}"
    return [sys.executable, *words[1:]]


@pytest.mark.runtime
@pytest.mark.timeout(600)
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    (model_file,) = _blocks("python")
    assert "Save as `tutorial_lm.py`" in TUTORIAL.read_text()
    (tmp_path / "tutorial_lm.py").write_text(model_file)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    lines = [line for block in _blocks("sh") for line in block.splitlines() if line.strip()]
    assert len(lines) == 4, lines
    outputs = []
    for line in lines:
        done = subprocess.run(_argv(line), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    train, loaded, sampled = outputs[1], outputs[2], outputs[3]
    assert "recovery: generation 1: lost rank 1" in train and "done: 60 steps" in train
    assert "CausalMixer" in loaded
    assert sampled.startswith("def ") and len(sampled) > len("def ")
