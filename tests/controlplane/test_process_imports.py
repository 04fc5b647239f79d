"""What the web server and the Celery worker load at start.

Neither needs torch: the planner predicts with it only when a plan is asked for. Importing it at
start cost each web process 2.0 s and about 180 MB (282 against 104 MB resident, measured), and the
first notice a fresh web process received waited for that import, because Django loads the URLconf
on the first request. The web entry point now loads the URLconf at start."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

PROBE = """
import json, os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
started = time.perf_counter()
import controlplane.asgi  # the web server's entry point (it loads controlplane.wsgi)
web_start_s = time.perf_counter() - started
from django.urls import get_resolver
loaded_at_start = "controlplane.webhooks.views" in sys.modules
from controlplane.celery import app
app.loader.import_default_modules()
print(json.dumps({"torch": "torch" in sys.modules, "urlconf_loaded_at_start": loaded_at_start,
                  "tasks": sorted(name for name in app.tasks if not name.startswith("celery."))}))
"""


def test_web_and_worker_start_without_torch_and_the_web_loads_its_urls_at_start() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["urlconf_loaded_at_start"], "the first request would import every view module"
    assert report["tasks"], "the worker's task modules were not found"
    assert report["torch"] is False, "a control-plane module imports torch at import time"
