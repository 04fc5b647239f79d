"""The import contracts of pyproject.toml ([tool.importlinter]: the runtime's layers, the apps that
must not reach up, production code that never imports the demo) hold, checked by `lint-imports`
as `make lint` runs it, so a new circle or upward import fails the suite before anyone trips on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


def test_the_import_contracts_hold() -> None:
    result = _lint_imports()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " 0 broken" in result.stdout and "runtime.train" not in result.stderr


def test_an_upward_import_breaks_a_layers_contract(tmp_path: Path) -> None:
    """The check is not vacuous: with the runtime's layers turned upside down, the imports the
    trainer makes of the config break the contract, and lint-imports names them."""
    config = tmp_path / "upside-down.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["runtime"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "upside down"\ntype = "layers"\n'
        'layers = ["runtime.config", "runtime.train"]\n'
    )
    result = _lint_imports("--config", str(config))
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and "runtime.train is not allowed to import runtime.config" in result.stdout
