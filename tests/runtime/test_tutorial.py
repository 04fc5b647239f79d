"""docs/tutorial.md, run as written and the way a reader runs it: its model file (and its
pyproject.toml) saved in a fresh folder, then every line of its `sh` blocks run there, in order, with
that folder as the working directory and not on any path: `spotpipe` is the installed console script,
`python` and `pip` this interpreter's. The control-plane part (the job file and a plain block) is run
by the scenario tests the tutorial names.

The console script runs with `PYTHONPATH` naming this checkout only, so the code under test is this
one whatever the environment's editable install points at; the reader's folder is never on it."""

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
CONSOLE_SCRIPT = """import sys
from spotpipe.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""
"""What pip writes for `[project.scripts] spotpipe = "spotpipe.cli:main"` (used when it is not installed)."""


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def _console_script(tmp_path: Path) -> Path:
    """The installed `spotpipe` (its sys.path starts with its own bin folder, not the working one)."""
    installed = Path(sys.executable).with_name("spotpipe")
    if installed.is_file():
        return installed
    script = tmp_path / "bin" / "spotpipe"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    return script


def _argv(line: str, spotpipe: Path) -> list[str]:
    words = shlex.split(line)
    if words[0] == "spotpipe":
        return [sys.executable, str(spotpipe), *words[1:]]
    if words[0] == "pip":
        # The build backend from this environment: the test machine has no index to fetch it from.
        return [sys.executable, "-m", "pip", *words[1:], "--no-build-isolation", "--no-deps"]
    assert words[0] == "python", f"the tutorial runs spotpipe, pip and python only: {line}"
    return [sys.executable, *words[1:]]


@pytest.mark.runtime
@pytest.mark.timeout(600)
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    text = TUTORIAL.read_text()
    (model_file,) = _blocks("python")
    (pyproject,) = _blocks("toml pyproject.toml")
    assert "Save as `tutorial_lm.py`" in text and "save as `pyproject.toml`" in text
    folder = tmp_path / "reader"
    folder.mkdir()
    (folder / "tutorial_lm.py").write_text(model_file)
    (folder / "pyproject.toml").write_text(pyproject)
    spotpipe = _console_script(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    lines = [line for block in _blocks("sh") for line in block.splitlines() if line.strip()]
    assert len(lines) == 5, lines
    outputs = []
    for line in lines:
        done = subprocess.run(_argv(line, spotpipe), cwd=folder, env=env, capture_output=True, text=True,
                              timeout=500)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    train, loaded, sampled = outputs[1], outputs[2], outputs[3]
    assert "recovery: generation 1: lost rank 1" in train and "done: 60 steps" in train
    assert "CausalMixer" in loaded
    assert sampled.startswith("def ") and len(sampled) > len("def ")
    assert [p.name for p in (folder / "dist").iterdir()] == ["tutorial_lm-0.1.0-py3-none-any.whl"]
    # Trained weights are never overwritten by running the command again: refused, naming --overwrite.
    again = subprocess.run(_argv(lines[1], spotpipe), cwd=folder, env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 2 and "runs/first already holds a run" in again.stderr, again.stderr
    assert "--overwrite" in again.stderr and "Traceback" not in again.stderr


@pytest.mark.timeout(120)
def test_the_console_script_imports_a_model_from_the_working_folder(tmp_path: Path) -> None:
    """`spotpipe train --model mymodule:fn` finds mymodule.py in the folder it runs from (as
    `python -m` would), though that folder is on no path: the model is checked here (a bad one is
    refused naming itself, not "importing failed")."""
    folder = tmp_path / "reader"
    folder.mkdir()
    (folder / "mymodel.py").write_text("from torch import nn\n\ndef net():\n    return [nn.ReLU()]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(_console_script(tmp_path)), "train", "--model", "mymodel:net",
                           "--out", "runs/x"], cwd=folder, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2, done.stderr
    assert "importing 'mymodel' failed" not in done.stderr
    assert "mymodel:net returns 1 layers and none holds parameters" in done.stderr, done.stderr
