"""Server processes freeze their start-up heap (controlplane/common/heap.py): full collections of
the cyclic collector then skip the few hundred thousand objects every process keeps for life."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["controlplane.asgi", "controlplane.wsgi"])
def test_the_web_application_freezes_its_start_up_heap(module: str) -> None:
    code = f"import gc, {module}; print(gc.get_freeze_count())"
    env = {**os.environ, "SPOTPIPE_DEV": "1", "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    # Django, DRF and every view module: well over 100,000 tracked objects.
    assert int(out.stdout.split()[-1]) > 100_000, out.stdout


def test_modules_imported_later_are_frozen_after_the_task_or_request_that_imported_them() -> None:
    """torch is imported by the planner's first prediction, long after start-up: its objects are
    frozen at the end of that task or request (`freeze_new_modules`), and nothing is frozen again
    while no module is imported."""
    code = (
        "import gc, controlplane.asgi\n"
        "from controlplane.common.heap import freeze_new_modules\n"
        "before = gc.get_freeze_count()\n"
        "freeze_new_modules()\n"
        "same = gc.get_freeze_count()\n"
        "import torch\n"
        "from django.core.signals import request_finished\n"
        "request_finished.send(sender=None)\n"
        "print(before, same, gc.get_freeze_count())\n"
    )
    env = {**os.environ, "SPOTPIPE_DEV": "1", "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    before, same, after = map(int, out.stdout.split()[-3:])
    assert same == before
    assert after > before + 100_000  # torch's objects


def test_celery_worker_processes_freeze_theirs_when_they_start() -> None:
    from celery import signals

    from controlplane import celery as celery_app

    connected = {
        signals.worker_process_init: celery_app._freeze_startup_heap,
        signals.worker_ready: celery_app._freeze_startup_heap,
        signals.beat_init: celery_app._freeze_startup_heap,
        signals.task_postrun: celery_app._freeze_new_modules,
    }
    for signal, receiver in connected.items():
        assert receiver in signal._live_receivers(None), signal.name
