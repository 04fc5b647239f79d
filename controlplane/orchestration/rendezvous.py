"""The per-job rendezvous store: started before the job's nodes, released with them.

The store is a torch.distributed TCPStore in its own process on the control plane's host
(`local/store_host.py`); the Django and Celery processes never import torch. Workers find it in
their generation's layout (`layout["rendezvous"]`, `host:port`); SPOTPIPE_RENDEZVOUS_HOST is the
host they dial (the control plane's address as the nodes see it). SPOTPIPE_RENDEZVOUS=none turns it
off (service tests, and nodes that bring their own).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.jobs.models import TrainingJob
from controlplane.orchestration.models import Rendezvous
from controlplane.orchestration.providers.local.provider import _CHILDREN, REPO_ROOT, pid_alive
from controlplane.tunables import tunable

START_TIMEOUT_S = 60.0
CLAIM_STALE_AFTER = timedelta(seconds=90)


def rendezvous_enabled() -> bool:
    return tunable("SPOTPIPE_RENDEZVOUS") != "none"


def _spawn() -> tuple[int, int]:
    directory = Path(settings.VAR_DIR) / "rendezvous"
    directory.mkdir(parents=True, exist_ok=True)
    info = directory / f"store-{uuid.uuid4().hex[:12]}.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(directory / "store.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "controlplane.orchestration.providers.local.store_host",
                                 "--info", str(info)], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _CHILDREN[proc.pid] = proc
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if info.exists():
            data = json.loads(info.read_text())
            info.unlink(missing_ok=True)
            return int(data["port"]), proc.pid
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"the rendezvous store did not start within {START_TIMEOUT_S}s; see {directory}/store.log")


def rendezvous_ensure(*, job: TrainingJob) -> str:
    """The job's store address, starting the store if needed. Concurrent callers start one: the
    first claims the job's row, the others wait for its address. Returns "" when disabled."""
    if not rendezvous_enabled():
        return ""
    deadline = time.monotonic() + START_TIMEOUT_S + 5
    while True:
        row = Rendezvous.objects.filter(job=job).first()
        if row is not None and row.released_at is None and row.address and row.pid and pid_alive(row.pid):
            return row.address
        now = timezone.now()
        claimed = False
        with transaction.atomic():
            if row is None:
                try:
                    with transaction.atomic():
                        Rendezvous.objects.create(job=job, address="", created_at=now)
                    claimed = True
                except IntegrityError:
                    claimed = False
            else:
                # Dead, released, or a claim nobody finished: take it over.
                stale = not row.address and now - row.created_at > CLAIM_STALE_AFTER
                dead = row.address and (row.released_at is not None or not row.pid or not pid_alive(row.pid))
                if stale or dead:
                    claimed = bool(Rendezvous.objects.filter(pk=row.pk, created_at=row.created_at).update(
                        address="", pid=None, released_at=None, created_at=now))
        if claimed:
            port, pid = _spawn()
            address = f"{tunable('SPOTPIPE_RENDEZVOUS_HOST')}:{port}"
            Rendezvous.objects.filter(job=job).update(address=address, pid=pid)
            return address
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job.pk}: the rendezvous store claimed by another worker never came up")
        time.sleep(0.1)


def rendezvous_address(*, job: TrainingJob) -> str:
    """The address if the store is up (no start)."""
    row = Rendezvous.objects.filter(job=job, released_at__isnull=True).exclude(address="").first()
    return row.address if row else ""


def rendezvous_release(*, job: TrainingJob) -> bool:
    """Stop the job's store (its workers are gone) and return once its process has ended: a store
    retired by another caller whose process still runs is stopped here too. Idempotent."""
    retired = rendezvous_retire(job=job) or (
        Rendezvous.objects.filter(job=job).exclude(released_at=None).exclude(pid=None).first())
    if retired is None:
        return False
    rendezvous_stop(retired)
    return True


def rendezvous_retire(*, job: TrainingJob) -> Rendezvous | None:
    """Mark the job's store released, so that from now on `rendezvous_ensure` starts a new one
    rather than hand this one out; returns the row whose process `rendezvous_stop` then ends (None:
    no store was live). Callers that may race a resume call it under the job's lock."""
    row = Rendezvous.objects.filter(job=job, released_at__isnull=True).first()
    if row is None:
        return None
    Rendezvous.objects.filter(pk=row.pk).update(released_at=timezone.now())
    return row


def rendezvous_stop(retired: Rendezvous) -> None:
    """End a retired store's process: SIGTERM, then SIGKILL after 3 s. The row forgets the pid once
    it is gone, so a later release never signals whatever process reuses that number."""
    if retired.pid and pid_alive(retired.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(retired.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        while pid_alive(retired.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(retired.pid, signal.SIGKILL)
    if retired.pid:
        # Only if no `rendezvous_ensure` has taken the row over with a store of its own meanwhile.
        Rendezvous.objects.filter(pk=retired.pk, pid=retired.pid).exclude(released_at=None).update(pid=None)
