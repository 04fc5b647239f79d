"""The `backend_independent` rule of tests/conftest.py holds: the code those tests reach imports no
Django, Celery, Redis or database driver, so CI may run them once (in the PostgreSQL pass) instead of
once per backend. Checked two ways: every import statement in runtime/ (including those inside
functions), and what importing the marked tests' modules actually loads, in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.conftest import BACKEND_INDEPENDENT_DIRS, REPO_ROOT

BACKEND_PACKAGES = ("django", "controlplane", "celery", "kombu", "redis", "psycopg", "psycopg2", "agent")


def _is_backend(module: str) -> bool:
    return module.split(".")[0] in BACKEND_PACKAGES


def test_runtime_package_imports_no_backend_code() -> None:
    found = []
    for path in sorted((REPO_ROOT / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            found += [f"{path.relative_to(REPO_ROOT)}:{node.lineno} {name}" for name in names if _is_backend(name)]
    assert found == []


PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""


def test_backend_independent_test_modules_load_no_backend_code(request: pytest.FixtureRequest) -> None:
    # The marked tests this run collected: in `make test`'s xdist part, where this test runs, all of them.
    modules = sorted({
        ".".join(item.path.relative_to(REPO_ROOT).with_suffix("").parts)
        for item in request.session.items if item.get_closest_marker("backend_independent")
    })
    assert any(m.startswith("tests.runtime.") for m in modules), "the rule marked no runtime test"
    assert all(m.split(".")[1] in BACKEND_INDEPENDENT_DIRS for m in modules)
    out = subprocess.run([sys.executable, "-c", PROBE % (BACKEND_PACKAGES,), *modules], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
