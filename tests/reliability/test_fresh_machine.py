"""`make test` on a fresh machine: the Makefile itself installs what the browser tests need (Debian's
chromium), says what to do when it cannot, and fails over at once from an unreachable PyTorch
index. Each run drives the real Makefile with a PATH whose `apt-get` is a stand-in."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")
# A Chromium name nothing provides, so the check finds none whatever this machine has installed.
MISSING = "spotpipe-test-no-chromium"


def _tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _make(target: str, bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SPOTPIPE_CHROMIUM"}
    environ.update(PATH=f"{bin_dir}:/usr/bin:/bin", CHROMIUM=MISSING, **env)
    return subprocess.run([MAKE, "-s", "-C", str(REPO_ROOT), target], env=environ, capture_output=True,
                          text=True, timeout=60)


def test_make_test_depends_on_the_browser_prerequisite() -> None:
    dry = subprocess.run([MAKE, "-n", "-p", "-C", str(REPO_ROOT), "browser"], capture_output=True, text=True,
                         timeout=60)
    # The rule itself, not a target-specific variable line (`test: SPOTPIPE_DEV = 1`).
    test_rule = next(line for line in dry.stdout.splitlines() if line.startswith("test:") and "=" not in line)
    assert "browser" in test_rule.split(":", 1)[1].split()


def test_browser_installs_debian_chromium_when_missing(tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    # The stand-in apt-get records its arguments and "installs" the browser on `install`.
    _tool(tmp_path, "apt-get", f'echo "$*" >> {log}\n'
                               f'case "$*" in *install*) printf "#!/bin/sh\\n" > {tmp_path}/{MISSING}; '
                               f'chmod +x {tmp_path}/{MISSING};; esac\n')
    _tool(tmp_path, "sudo", 'shift; exec "$@"\n')  # "sudo -n cmd": whoever runs the suite
    result = _make("browser", tmp_path)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("update")
    assert calls[1].split()[:3] == ["install", "-y", "-qq"] and calls[1].split()[-1] == "chromium"


def test_browser_fails_with_what_to_do_when_it_cannot_install(tmp_path: Path) -> None:
    _tool(tmp_path, "apt-get", "exit 100\n")
    _tool(tmp_path, "sudo", 'shift; exec "$@"\n')
    result = _make("browser", tmp_path)
    assert result.returncode != 0
    assert "apt-get install -y chromium" in result.stderr and "SPOTPIPE_CHROMIUM" in result.stderr


def test_browser_accepts_an_explicit_chromium(tmp_path: Path) -> None:
    _tool(tmp_path, "apt-get", f"touch {tmp_path}/called; exit 100\n")
    _tool(tmp_path, "my-chromium", "exit 0\n")
    result = _make("browser", tmp_path, SPOTPIPE_CHROMIUM=str(tmp_path / "my-chromium"))
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "called").exists()


def test_torch_index_is_tried_once_without_retries() -> None:
    """pip's default is five retries with backoff per unreachable index (about 7 s here before the
    local wheel was used); one try with a short timeout fails over at once."""
    dry = subprocess.run([MAKE, "-n", "-B", "-C", str(REPO_ROOT), ".venv/.spotpipe-installed"],
                         capture_output=True, text=True, timeout=60)
    torch_line = next(line for line in dry.stdout.splitlines() if "--extra-index-url" in line)
    assert "--retries 0" in torch_line and "--timeout" in torch_line


def test_ci_relies_on_make_for_the_browser() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci
