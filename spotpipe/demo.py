"""The demo: seed a team, a user and the market, then serve the control plane with a worker.

The full demo (a training job on local nodes under preemptions) is issue 8; this part gives a
newcomer a running control plane, API docs and admin on the embedded default."""

from __future__ import annotations

import signal
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import transaction

from controlplane.accounts.models import Membership, Role, Team
from spotpipe import processes

DEMO_USER = "demo"
DEMO_PASSWORD = "spotpipe-demo"


@transaction.atomic
def seed_demo_team() -> tuple[Team, str]:
    """Create (idempotently) the demo team and an admin user; returns the team and username."""
    team, _ = Team.objects.get_or_create(slug="demo", defaults={"name": "Demo team"})
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True})
    if created or not user.has_usable_password():
        user.set_password(DEMO_PASSWORD)
        user.is_staff = True
        user.is_superuser = True
        user.save()
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": Role.ADMIN})
    return team, user.username


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(*, host: str, port: int, start_worker: bool) -> int:
    """Migrate, seed, start web (and worker), and serve until Ctrl-C."""
    # SIGTERM (docker stop, timeout, CI) must clean up like Ctrl-C does: no orphan processes.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    call_command("migrate", interactive=False, verbosity=0)
    team, username = seed_demo_team()
    log_dir = settings.VAR_DIR / "logs"
    procs = [processes.start(["manage.py", "runserver", f"{host}:{port}", "--noreload"],
                             log_path=log_dir / "web.log")]
    if start_worker:
        procs.append(processes.start(["-m", "celery", "-A", "controlplane", "worker", "--loglevel=INFO",
                                      "--concurrency=1"], log_path=log_dir / "worker.log"))
    base = f"http://{host}:{port}"
    print(f"spotpipe control plane on {base}/  (team {team.slug!r}, user {username!r} / {DEMO_PASSWORD!r})")
    print(f"  API docs: {base}/api/v1/docs/   admin: {base}/admin/   logs: {log_dir}")
    print("Ctrl-C to stop.")
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("a process exited; see the logs", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            processes.stop(proc)
