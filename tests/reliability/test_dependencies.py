"""Each role's extra installs what its code imports, and nothing of another role is needed.

pyproject.toml splits the dependencies by role: a training node installs `spotpipe[runtime]` (the
agent and the torch runtime, no Django), the control plane `spotpipe[controlplane]`. A module that
imports a package its role does not install works here (`make test` installs every extra) and fails
only on a real node or server. So each test below imports every module of a role in a fresh
interpreter where every installed distribution outside that role's requirements (followed
transitively through their own requirements) is blocked, as on a machine that has only that role.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"agent", "runtime", "controlplane", "frontend", "spotpipe", "bench", "tests", "manage"}

# Imports inside functions that a role may use only when an optional extra is installed; each is
# reached only from a feature that says so (docs/data.md `hf:`, `spotpipe train` TensorBoard files,
# the simulator's plots). Importing the module itself must not need them.
OPTIONAL_EXTRAS = ("hf", "tensorboard", "plots")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _closure(requirements: list[str], extras: set[str] | None = None) -> set[str]:
    """Normalised names of the distributions these requirements install, transitively."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras or set()) for r in requirements]
    while todo:
        req, active = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = metadata.distribution(req.name).metadata["Name"].lower().replace("_", "-")
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for sub in metadata.requires(req.name) or []:
            todo.append((Requirement(sub), set(req.extras)))
    return {k.split("[")[0] for k in seen}


def _role_distributions(role: str) -> set[str]:
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    return _closure([*project["dependencies"], *extras[role]])


def _blocked_modules(allowed: set[str]) -> list[str]:
    """Top-level modules of installed distributions outside `allowed` (first-party ones aside)."""
    blocked = []
    for module, dists in metadata.packages_distributions().items():
        names = {d.lower().replace("_", "-") for d in dists}
        if module in FIRST_PARTY or module.startswith("_") or names & (allowed | {"spotpipe"}):
            continue
        blocked.append(module)
    return sorted(blocked)


def _modules(packages: list[str], skip: tuple[str, ...]) -> list[str]:
    out = []
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts).removesuffix(".__init__")
            if not any(name.startswith(s) for s in skip):
                out.append(name)
    return out


_IMPORT_ALL = """
import importlib, json, sys
# A None entry makes `import x` raise ModuleNotFoundError and `importlib.util.find_spec("x")` answer
# None, exactly as when x is not installed (libraries probing optional packages see it absent).
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
if sys.argv[3]:
    import django
    django.setup()
failed = []
for module in json.loads(sys.argv[2]):
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        failed.append(f"{module}: {exc}")
print(json.dumps(failed))
"""


def _import_all(role: str, packages: list[str], *, skip: tuple[str, ...] = (), django: bool = False) -> list[str]:
    blocked = _blocked_modules(_role_distributions(role))
    modules = _modules(packages, skip)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings_dev", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, json.dumps(blocked), json.dumps(modules), "1" if django else ""],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# `spotpipe demo` runs a control plane in-process: its package belongs to the control plane's role.
DEMO_MODULES = ("spotpipe.demo",)


def test_the_node_role_imports_no_control_plane_package() -> None:
    """Every module of the agent, the runtime and the CLI (`spotpipe train`, `sample`, `submit`)
    imports with only `spotpipe[runtime]` installed."""
    blocked = _blocked_modules(_role_distributions("runtime"))
    assert "django" in blocked and "celery" in blocked  # the block is real: the node has no Django
    assert _import_all("runtime", ["agent", "runtime", "spotpipe"], skip=DEMO_MODULES) == []


def test_the_control_plane_role_imports_only_its_extra() -> None:
    """Every module of the control plane and the dashboard imports with `spotpipe[controlplane]`;
    management commands that drive a browser are development tools (playwright is in `dev`)."""
    blocked = _blocked_modules(_role_distributions("controlplane"))
    assert "pytest" in blocked and "safetensors" in blocked
    failed = _import_all(
        "controlplane", ["controlplane", "frontend"],
        skip=("frontend.management.commands.dashboard_screenshots", "frontend.browser"),
        django=True,
    )
    assert failed == []


def test_the_dev_extra_holds_every_role() -> None:
    """`make test` installs `.[dev]`: it must bring every role's extra, so the suite covers them."""
    extras = _pyproject()["project"]["optional-dependencies"]
    dev = _closure(extras["dev"])
    for role in ("controlplane", "runtime", *OPTIONAL_EXTRAS):
        assert _closure(extras[role]) <= dev, role


@pytest.mark.parametrize("dropped", ["django-celery-beat", "gunicorn"])
def test_dropped_packages_are_not_required(dropped: str) -> None:
    """Beat uses Celery's file scheduler and the web server is granian: neither is a dependency of
    any role (gunicorn stays in the dev extra only, for `bench webhooks`' gunicorn variants)."""
    extras = _pyproject()["project"]["optional-dependencies"]
    roles = [r for name, v in extras.items() if name != "dev" for r in v]
    assert dropped not in _closure([*_pyproject()["project"]["dependencies"], *roles])


# The runtime modules the control plane, the planner and the simulator use without torch (the
# control plane's web and Celery processes never load it: tests/controlplane/test_process_imports.py).
# A runtime package's __init__ imports nothing, so these load even where their package also holds
# torch modules (runtime.train.executor, runtime.distributed.comm, ...): docs/runtime.md, "Modules".
TORCH_FREE = (
    "runtime.config", "runtime.strategies", "runtime.parallel.layout", "runtime.parallel.partition",
    "runtime.parallel.schedule", "runtime.distributed.membership", "runtime.checkpointing.durability",
    "runtime.train.metrics_log", "runtime.sim.engine", "runtime.planner.search",
)

_TORCH_FREE_PROBE = """
import importlib, json, sys
sys.modules["torch"] = None  # as if torch were not installed
for module in json.loads(sys.argv[1]):
    importlib.import_module(module)
from runtime.config import STRATEGIES, JobConfig, ModelSpec
from runtime.parallel.schedule import build_schedule
from runtime.strategies import get_strategy
from runtime.strategies.base import full_slots
config = JobConfig(dp=2, pp=2, microbatches=2, global_batch=8, steps=4, model=ModelSpec(n_layer=2))
slots = full_slots(config)
slots[1][0] = None  # one node lost
actions = {}
for name in STRATEGIES:
    if name in ("none", "checkpoint"):
        continue  # these stop or restart on a loss instead of reshaping the layout
    layout = get_strategy(name).layout_for(config, slots)
    actions[name] = sum(len(a) for a in build_schedule(layout).values())
print(json.dumps({"torch": sys.modules["torch"] is not None, "actions": actions}))
"""


def test_the_torch_free_runtime_modules_import_and_plan_without_torch() -> None:
    """With torch absent, the torch-free modules import and every reshaping strategy lays out a
    job that lost a node, and its schedule is built."""
    out = subprocess.run([sys.executable, "-c", _TORCH_FREE_PROBE, json.dumps(TORCH_FREE)], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["torch"] is False
    assert set(report["actions"]) == {"bamboo", "recycle", "oobleck"}
    assert all(n > 0 for n in report["actions"].values()), report
