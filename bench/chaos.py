"""Chaos soak: the whole stack trains a job while a seeded schedule of faults hits it.

    python -m bench chaos [--quick] [--json PATH] [--seed N] [--steps N] [--var-dir DIR]

The stack is real and private to the soak: its own PostgreSQL cluster and Redis server (free ports,
data in the var dir), the web server (granian, threaded), a Celery worker and Celery beat, and the
local provider's nodes (agent + torch runtime) training a DP=2 x PP=2 GPT job with the recycle
strategy. Faults, in a seeded order, spread over the job's progress:

- `notice`: a node's metadata endpoint serves an interruption notice; the node goes when it ends;
- `notice_webhook`: the same, and the notice is also posted to the signed generic webhook, then the
  same delivery again (a replay must act once);
- `kill`: a node's process group is SIGKILLed (no notice: heartbeats stop);
- `worker`: the Celery worker is SIGKILLed (tasks in flight die with it) and started again;
- `redis`: Redis is SIGKILLed and started again, empty (queued messages are lost);
- `web`: the web server is stopped (SIGTERM) and started again;
- `postgres`: PostgreSQL is stopped (fast shutdown: every connection is cut) and started again.

Node faults wait for a healthy job (every slot held by a node that trains): see docs/reliability.md.
At the end the soak checks: every notice stored once and processed once (and none lost), no
reconfiguration applied twice, the job finished with the parameters of the failure-free run of the
same seed, the billing ledger covers each instance's life exactly (no gap, no overlap), and no
process outlives the stack. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._chaos_servers import PrivatePostgres, PrivateRedis, free_port
from bench.report import Progress, print_table

REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_FAULTS = ("notice", "notice_webhook", "kill")
STACK_FAULTS = ("worker", "redis", "web", "postgres")


@dataclass(frozen=True, slots=True)
class Profile:
    steps: int
    faults: dict[str, int]
    min_gap_s: float
    timeout_s: float


# Full: 22 faults, at least 24 s apart, so that they span 10 minutes whatever the machine's speed; the
# job's 5400 steps last ~10-15 minutes here (~6-9 steps/s under faults). Quick (CI): one fault of each kind.
FULL = Profile(steps=5400, faults={"notice": 4, "notice_webhook": 3, "kill": 4, "worker": 3, "redis": 3, "web": 3,
                                   "postgres": 2}, min_gap_s=24.0, timeout_s=2100.0)
QUICK = Profile(steps=440, faults={"notice": 1, "notice_webhook": 1, "kill": 1, "worker": 1, "redis": 1, "web": 1,
                                   "postgres": 1}, min_gap_s=4.0, timeout_s=200.0)
# The job: the end-to-end tests' MLP (tests/orchestration/test_end_to_end.py), 4 layers for DP=2 x PP=2,
# compute padded to an emulated device time so that stages overlap as on GPUs.
CONFIG = {"model": {"kind": "mlp", "n_layer": 4, "n_embd": 16}, "global_batch": 8, "op_timeout_s": 2.0,
          "schedule": "fiw", "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}}
# Production's default is 2 s; on this shared 2-core machine a node busy starting its torch worker can
# miss 2 s of heartbeats (a false death before the first step hangs the job: see docs/reliability.md).
HEARTBEAT_TIMEOUT_S = 5.0
# Faults fire between these fractions of the job's steps.
WINDOW = (0.03, 0.70)


def requirements(*, quick: bool, **_options: object) -> list[str]:
    """What the soak needs that is not installed (its own PostgreSQL and Redis servers)."""
    from bench._chaos_servers import missing_binaries

    return missing_binaries()


def parse_args(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench chaos")
    parser.add_argument("--seed", type=int, default=0, help="fault schedule, victims and the job's seed")
    parser.add_argument("--steps", type=int, default=0, help="the job's steps (default: the profile's)")
    parser.add_argument("--var-dir", type=Path, default=None, help="default: var/chaos-full or var/chaos-quick")
    parser.add_argument("--no-faults", action="store_true",
                        help="inject nothing (a control run: every check must pass without faults too)")
    args = parser.parse_args(argv)
    return {"seed": args.seed, "steps": args.steps, "var_dir": args.var_dir, "no_faults": args.no_faults}


def fault_schedule(profile: Profile, *, seed: int) -> list[tuple[float, str]]:
    """(fraction of the job's steps, fault kind), in a seeded order, evenly spread over WINDOW."""
    kinds = [kind for kind, count in profile.faults.items() for _ in range(count)]
    random.Random(seed).shuffle(kinds)
    lo, hi = WINDOW
    return [(lo + (hi - lo) * i / max(1, len(kinds) - 1), kind) for i, kind in enumerate(kinds)]


@dataclass
class FaultRecord:
    index: int
    kind: str
    at_s: float
    at_step: int
    detail: str
    took_s: float
    instance: int | None = None
    provider_id: str = ""
    webhook_answers: list[int] = field(default_factory=list)


class Soak:
    """One run: servers, stack, job, faults, checks. `close()` always stops everything."""

    def __init__(self, *, profile: Profile, seed: int, steps: int, var_dir: Path, quick: bool) -> None:
        self.profile = profile
        self.seed = seed
        self.steps = steps or profile.steps
        self.var_dir = var_dir.resolve()
        self.quick = quick
        self.started = time.monotonic()
        self.faults: list[FaultRecord] = []
        self.stack = None
        self.provider = None
        self.job = None
        self.pg: PrivatePostgres | None = None
        self.redis: PrivateRedis | None = None
        self.timeline = None
        self.reference: subprocess.Popen | None = None
        self.unplanned_exits: list[dict[str, Any]] = []

    # --- output --------------------------------------------------------------------------------
    def clock(self) -> str:
        return f"{time.monotonic() - self.started:7.1f}s"

    def say(self, text: str) -> None:
        print(f"[{datetime.now(UTC):%H:%M:%S} {self.clock()}] {text}", flush=True)

    # --- set-up --------------------------------------------------------------------------------
    def start_servers(self) -> None:
        import shutil

        from spotpipe.demo import processes

        processes.sweep(self.var_dir)  # anything left by an interrupted run of this var dir
        self.pg = PrivatePostgres(self.var_dir / "postgres")
        self.pg.init()
        # Each soak starts on a fresh database: what an earlier soak of this var dir wrote goes too.
        for sub in ("nodes", "logs", "checkpoints", "broker", "artifacts"):
            shutil.rmtree(self.var_dir / sub, ignore_errors=True)
        self.pg.start()
        self.pg.create_database()
        self.redis = PrivateRedis(self.var_dir / "redis")
        self.redis.start()
        self.say(f"private PostgreSQL on 127.0.0.1:{self.pg.port}, Redis on 127.0.0.1:{self.redis.port}, "
                 f"var dir {self.var_dir}")

    def setup_django(self) -> None:
        self.web_port = free_port()
        self.base = f"http://127.0.0.1:{self.web_port}"
        os.environ.update({
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DATABASE_URL": self.pg.url, "REDIS_URL": self.redis.url, "CELERY_BROKER_URL": "",
            "SPOTPIPE_VAR_DIR": str(self.var_dir), "SPOTPIPE_PUBLIC_URL": self.base,
            "SPOTPIPE_RENDEZVOUS": "process", "SPOTPIPE_LOCAL_NODES_DIR": str(self.var_dir / "nodes"),
            "SPOTPIPE_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S), "DEBUG": "0",
        })
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        self.say("migrated")

    def start_stack(self) -> None:
        from controlplane.orchestration.providers.local.provider import LocalProvider
        from spotpipe.demo import processes

        self.stack = processes.Stack(var_dir=self.var_dir, env={})
        self.provider = LocalProvider(self.var_dir / "nodes", start_timeout_s=60)
        self.stack.start_granian(host="127.0.0.1", port=self.web_port, workers=1, threads=48)
        self.stack.start_worker(concurrency=3)
        self.stack.start_beat()
        self.wait_web(timeout_s=60)
        self.say(f"stack up: web (granian) {self.base}, Celery worker and beat; logs in {self.stack.log_dir}")

    def wait_web(self, *, timeout_s: float) -> float:
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            try:
                # /healthz pings the Celery workers for 1 s and opens fresh database and broker
                # connections: on a loaded machine the first answer of a new server took over 2 s.
                with urllib.request.urlopen(f"{self.base}/healthz", timeout=15):
                    return time.monotonic() - started
            except urllib.error.HTTPError:  # it answers (an unhealthy broker or worker is not its fault)
                return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the web server did not answer within {timeout_s:.0f} s; see {self.stack.log_dir}/web.log")

    def submit(self) -> None:
        from controlplane.orchestration import tasks
        from controlplane.webhooks.credentials import credential_create
        from spotpipe.demo import seed
        from spotpipe.demo.driver import Console, Driver, submit_job

        seed.seed_market(seed=self.seed)
        team = seed.seed_team()
        self.team_slug = team.team.slug
        _credential, self.webhook_secret = credential_create(team=team.team, source="generic",
                                                             scheme="standard_webhooks")
        # The model whose final parameters the end-to-end tests compare with the reference run.
        self.job = submit_job(team=team.team, user=team.user, strategy="recycle", nodes=4, steps=self.steps,
                              seed=self.seed, checkpoint_dir=self.var_dir / "checkpoints", config=CONFIG)
        tasks.acquire_capacity.delay(self.job.pk)
        self.driver = Driver(job=self.job, schedule=[], provider=self.provider,
                             console=Console(open(self.var_dir / "timeline.log", "w"), started=self.started),  # noqa: SIM115
                             dp=2, pp=2)
        self.say(f"job {self.job.pk}: MLP, {self.steps} steps, DP=2 x PP=2 on 4 local nodes, strategy recycle, "
                 f"seed {self.seed}")

    # --- database access that survives a PostgreSQL restart ------------------------------------
    def db(self, fn, *args, retry_s: float = 90.0, **kwargs):
        from django.db import Error, connections

        deadline = time.monotonic() + retry_s
        while True:
            try:
                return fn(*args, **kwargs)
            except Error:
                connections.close_all()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def healthy(self) -> bool:
        """Every slot of the current generation held by a running node that has trained since."""
        from controlplane.jobs.models import JobStatus

        if self.job.status != JobStatus.RUNNING:
            return False
        members = self.driver._members()
        self.driver.training = self.driver._training()
        return len(members) == 4 and {i.pk for i in members.values()} <= self.driver.training

    # --- faults --------------------------------------------------------------------------------
    def victim(self, rng: random.Random) -> Any:
        members = self.driver._members()
        return members[rng.choice(sorted(members))]

    def post_webhook_notice(self, provider_id: str, msg_id: str, deadline: datetime) -> int:
        """Post a signed generic notice; retried like a cloud's sender while the web server is down."""
        from controlplane.webhooks.signing import signed_headers

        body = json.dumps({"instance_id": provider_id, "action": "terminate",
                           "deadline": deadline.isoformat().replace("+00:00", "Z")}).encode()
        until = time.monotonic() + 60
        while True:
            headers = {"Content-Type": "application/json",
                       **signed_headers(secret=self.webhook_secret, msg_id=msg_id, body=body)}
            request = urllib.request.Request(f"{self.base}/api/v1/webhooks/notice/{self.team_slug}/", data=body,
                                             headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return answer.status
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code != 429:
                    return exc.code
            except OSError:
                pass
            if time.monotonic() > until:
                return 0
            time.sleep(0.5)

    def inject(self, index: int, kind: str, rng: random.Random) -> FaultRecord:
        from spotpipe.demo.preemption_script import NOTICE_S

        t0 = time.monotonic()
        record = FaultRecord(index=index, kind=kind, at_s=round(t0 - self.started, 1), at_step=self.job.steps_done,
                             detail="", took_s=0.0)
        if kind in NODE_FAULTS:
            instance = self.victim(rng)
            record.instance, record.provider_id = instance.pk, instance.provider_instance_id
            where = f"instance {instance.pk} ({instance.provider_instance_id})"
            if kind == "kill":
                self.provider.kill(instance.provider_instance_id)
                record.detail = f"killed {where}, no notice"
            else:
                if kind == "notice_webhook":
                    deadline = datetime.now(UTC) + timedelta(seconds=NOTICE_S)
                    msg_id = f"chaos-{self.seed}-{index}"
                    record.webhook_answers = [self.post_webhook_notice(record.provider_id, msg_id, deadline)
                                              for _ in range(2)]
                self.provider.preempt(instance.provider_instance_id, notice_s=NOTICE_S)
                record.detail = f"{NOTICE_S:g} s notice to {where}" + (
                    f" (metadata + webhook, answers {record.webhook_answers[0]} then replay "
                    f"{record.webhook_answers[1]})" if kind == "notice_webhook" else " (metadata endpoint)")
        elif kind == "worker":
            old = self.stack.procs["worker"].pid
            os.killpg(old, signal.SIGKILL)
            self.stack.procs["worker"].wait(timeout=10)
            time.sleep(1.0)
            self.stack.start_worker(concurrency=3)
            record.detail = f"SIGKILLed the Celery worker (pid {old}), started pid {self.stack.procs['worker'].pid}"
        elif kind == "redis":
            self.redis.kill()
            time.sleep(1.0)
            self.redis.start()
            record.detail = f"SIGKILLed Redis and started it again, empty (port {self.redis.port})"
        elif kind == "web":
            from spotpipe.demo import processes

            processes.stop(self.stack.procs.pop("web"), timeout=8.0)
            self.stack.start_granian(host="127.0.0.1", port=self.web_port, workers=1, threads=48)
            self.wait_web(timeout_s=60)
            record.detail = "stopped the web server (SIGTERM) and started it again"
        elif kind == "postgres":
            self.pg.stop(mode="fast")
            time.sleep(1.0)
            self.pg.start()
            record.detail = "stopped PostgreSQL (fast shutdown, connections cut) and started it again"
        record.took_s = round(time.monotonic() - t0, 1)
        return record

    def run_job(self) -> None:
        from controlplane.jobs.models import ACTIVE_JOB_STATUSES

        schedule = fault_schedule(self.profile, seed=self.seed)
        rng = random.Random(self.seed + 1)
        self.say(f"fault schedule (seed {self.seed}): " + ", ".join(f"{k}@{f:.0%}" for f, k in schedule))
        deadline = self.started + self.profile.timeout_s
        last_fault = 0.0
        last_progress = 0.0
        while time.monotonic() < deadline:
            self.db(self.job.refresh_from_db)
            self.db(self.driver.print_new_events)
            if self.reference is None and self.job.current_generation > 0:
                self.start_reference()
            if self.job.status not in ACTIVE_JOB_STATUSES:
                break
            for name in self.stack.exited():
                self.supervise(name)
            if schedule:
                fraction, kind = schedule[0]
                due = self.job.steps_done >= fraction * self.job.target_steps
                spaced = time.monotonic() - last_fault >= self.profile.min_gap_s
                ready = self.job.current_generation > 0 and (kind in STACK_FAULTS or self.db(self.healthy))
                if due and spaced and ready:
                    schedule.pop(0)
                    record = self.inject(len(self.faults) + 1, kind, rng)
                    self.faults.append(record)
                    last_fault = time.monotonic()
                    self.say(f"fault {record.index:>2} {kind:<14} at step {record.at_step:>5}: {record.detail} "
                             f"({record.took_s:g} s)")
            if time.monotonic() - last_progress >= 15:
                last_progress = time.monotonic()
                self.say(f"progress: step {self.job.steps_done}/{self.job.target_steps}, generation "
                         f"{self.job.current_generation}, {self.job.status}, {len(self.faults)} fault(s) injected")
            time.sleep(0.25)
        self.not_injected = [kind for _f, kind in schedule]
        self.say(f"job {self.job.pk} {self.job.status} at step {self.job.steps_done}/{self.job.target_steps}")
        # The control plane releases the nodes of an ended job by itself.
        release_deadline = time.monotonic() + (45 if self.job.status not in ACTIVE_JOB_STATUSES else 0)
        while time.monotonic() < release_deadline and self.db(self.live_instances):
            time.sleep(0.5)
        self.db(self.driver.print_new_events)

    def supervise(self, name: str) -> None:
        """Start again a stack process that exited by itself, as a process supervisor does in
        production (systemd `Restart=always`, compose `restart: unless-stopped`), and report it:
        kombu 5.7's Redis transport can end the Celery worker ("Unrecoverable error: AttributeError:
        'NoneType' object has no attribute 'hostname'") when Redis goes away while it holds
        unacknowledged messages."""
        code = self.stack.procs[name].returncode
        at_s = round(time.monotonic() - self.started, 1)
        self.unplanned_exits.append({"process": name, "exit_code": code, "at_s": at_s})
        if len(self.unplanned_exits) > 10:
            raise RuntimeError(f"{name} keeps exiting by itself; see {self.stack.log_dir}")
        if name == "worker":
            self.stack.start_worker(concurrency=3)
        elif name == "beat":
            self.stack.start_beat()
        else:
            self.stack.start_granian(host="127.0.0.1", port=self.web_port, workers=1, threads=48)
        self.say(f"UNPLANNED: the {name} exited by itself (code {code}); restarted it as a supervisor would "
                 f"(see {self.stack.log_dir}/{name}.log)")

    def start_reference(self) -> None:
        """The failure-free run of the same seed (one process, no faults), trained in the background
        while the soak runs: its parameters are what the job must end with."""
        # The job's stored contract is the runtime's config.
        (self.var_dir / "reference-config.json").write_text(json.dumps(self.job.config))
        with (self.var_dir / "reference.log").open("wb") as log:
            self.reference = subprocess.Popen(
                [sys.executable, "-m", "bench.chaos", "--reference", str(self.var_dir / "reference-config.json"),
                 str(self.var_dir / "reference.pt")], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def live_instances(self) -> int:
        from controlplane.fleet.models import Instance

        return Instance.objects.filter(job=self.job, state__in=("requested", "pending", "running", "notice")).count()

    # --- end -----------------------------------------------------------------------------------
    def stop_stack_and_count_orphans(self) -> list[str]:
        """Stop beat, worker and web gracefully; whatever still carries the stack's mark a few
        seconds later (a node, an agent, a worker, a rendezvous store) is an orphan."""
        from spotpipe.demo import processes

        if self.stack is not None:
            self.stack.stop()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and processes.stray_pids(self.var_dir):
            time.sleep(0.25)
        orphans = []
        for pid in processes.stray_pids(self.var_dir):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            orphans.append(f"{pid}: {cmd.strip()[:160]}")
        return orphans

    def close(self) -> None:
        from spotpipe.demo import processes

        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.stop()
        swept = processes.sweep(self.var_dir)
        if swept:
            self.say(f"swept {len(swept)} stray process(es)")
        if self.reference is not None and self.reference.poll() is None:
            self.reference.kill()
            self.reference.wait(timeout=10)
        if self.redis is not None:
            self.redis.kill()
        if self.pg is not None:
            self.pg.stop(mode="immediate")


# --- checks ----------------------------------------------------------------------------------------


def check_notices(job: Any, faults: list[FaultRecord]) -> dict[str, Any]:
    """Each notice fault must leave a processed notice per expected source (agent; and the webhook's),
    every stored notice processed, each processed exactly once (one timeline event), the webhook
    replay stored nothing."""
    from controlplane.fleet.models import InterruptionNotice
    from controlplane.jobs.models import JobEvent

    notices = list(InterruptionNotice.objects.all())
    events = Counter(e.data.get("notice") for e in JobEvent.objects.filter(job=job, kind__startswith="instance_")
                     if isinstance(e.data, dict) and e.data.get("notice"))
    lost: list[str] = []
    for fault in faults:
        if fault.kind not in ("notice", "notice_webhook"):
            continue
        expected = {"agent"} | ({"generic"} if fault.kind == "notice_webhook" else set())
        for source in sorted(expected):
            found = [n for n in notices if n.provider_instance_id == fault.provider_id and n.source == source]
            if not any(n.status == "processed" for n in found):
                lost.append(f"fault {fault.index}: no processed {source} notice for {fault.provider_id}")
    unprocessed = [f"notice {n.pk} ({n.source}, {n.provider_instance_id}) is {n.status}" for n in notices
                   if n.status != "processed"]
    processed_twice = [f"notice {n.pk}: {events[n.pk]} timeline events" for n in notices if events[n.pk] > 1]
    not_acted = [f"notice {n.pk}: no timeline event" for n in notices if n.status == "processed" and events[n.pk] == 0]
    replays = [f for f in faults if f.kind == "notice_webhook"]
    bad_replays = [f"fault {f.index}: answers {f.webhook_answers}" for f in replays if f.webhook_answers != [202, 200]]
    generic = Counter(n.provider_instance_id for n in notices if n.source == "generic")
    stored_twice = [f"fault {f.index}: {generic[f.provider_id]} rows" for f in replays
                    if generic[f.provider_id] != 1]
    return {"notices_stored": len(notices), "lost_notices": len(lost) + len(unprocessed),
            "notices_processed_twice": len(processed_twice), "notices_not_acted_on": len(not_acted),
            "webhook_replays": len(replays), "webhook_replays_not_idempotent": len(bad_replays) + len(stored_twice),
            "details": lost + unprocessed + processed_twice + not_acted + bad_replays + stored_twice}


def check_reconfigurations(job: Any) -> dict[str, Any]:
    """No trigger decided twice, no generation published twice for one decision, no node removed
    from the job twice."""
    from controlplane.jobs.models import JobGeneration, Reconfiguration

    reconfigurations = list(Reconfiguration.objects.filter(job=job))
    by_key = Counter(r.trigger_key for r in reconfigurations)
    by_generation = Counter(r.to_generation for r in reconfigurations if r.status == "applied" and r.to_generation)
    generations = list(JobGeneration.objects.filter(job=job).order_by("number"))
    removed: Counter = Counter()
    for before, after in itertools.pairwise(generations):
        members_after = {m["instance"] for m in after.membership}
        for m in before.membership:
            if m["instance"] not in members_after:
                removed[m["instance"]] += 1
    details = [f"trigger {k} decided {n} times" for k, n in by_key.items() if n > 1]
    details += [f"generation {g} published by {n} reconfigurations" for g, n in by_generation.items() if n > 1]
    details += [f"instance {i} removed {n} times" for i, n in removed.items() if n > 1]
    return {"reconfigurations": len(reconfigurations),
            "applied": sum(1 for r in reconfigurations if r.status == "applied"),
            "generations": len(generations), "double_reconfigurations": len(details), "details": details}


def check_ledger(job: Any) -> dict[str, Any]:
    """Each instance's segments tile [running_at, ended_at) exactly: no gap, no overlap."""
    from controlplane.billing.models import BillingSegment
    from controlplane.fleet.models import Instance

    details = []
    billed_s = life_s = 0.0
    instances = list(Instance.objects.filter(job=job))
    for instance in instances:
        segments = list(BillingSegment.objects.filter(instance=instance).order_by("start", "id"))
        if instance.running_at is None:
            if segments:
                details.append(f"instance {instance.pk} never ran but has {len(segments)} segment(s)")
            continue
        if instance.ended_at is None:
            details.append(f"instance {instance.pk} is still {instance.state}")
            continue
        life_s += (instance.ended_at - instance.running_at).total_seconds()
        if not segments:
            details.append(f"instance {instance.pk} ran {instance.running_at:%H:%M:%S} to {instance.ended_at:%H:%M:%S} "
                           "with no segment")
            continue
        cursor = instance.running_at
        for segment in segments:
            if segment.start != cursor:
                what = "gap" if segment.start > cursor else "overlap"
                details.append(f"instance {instance.pk}: {what} of {abs((segment.start - cursor).total_seconds()):.3f}"
                               f" s at {cursor:%H:%M:%S.%f}")
            if segment.end is None:
                details.append(f"instance {instance.pk}: segment {segment.pk} still open after the instance ended")
                break
            billed_s += (segment.end - segment.start).total_seconds()
            cursor = max(cursor, segment.end)
        else:
            if cursor != instance.ended_at:
                details.append(f"instance {instance.pk}: billed until {cursor:%H:%M:%S.%f}, ended "
                               f"{instance.ended_at:%H:%M:%S.%f}")
    return {"instances": len(instances), "billed_s": round(billed_s, 3), "life_s": round(life_s, 3),
            "ledger_gaps": len(details), "details": details}


def check_params(soak: Soak, nodes_dir: Path) -> dict[str, Any]:
    """The finished nodes' parameters against the failure-free single-process run of the same seed:
    bit for bit, since the runtime sums gradients in one fixed order (`runtime.distributed.grad_order`)."""
    import torch

    if soak.reference is None:
        return {"params_match": False, "details": ["the job never got a first generation"]}
    try:
        code = soak.reference.wait(timeout=900)
    except subprocess.TimeoutExpired:
        return {"params_match": False, "details": ["the failure-free run did not end within 900 s"]}
    if code:
        return {"params_match": False, "details": [f"the failure-free run failed; see {soak.var_dir}/reference.log"]}
    reference = torch.load(soak.var_dir / "reference.pt")
    copies: dict[str, list] = {}
    for path in sorted(nodes_dir.glob("*/work/out/node-*.pt")):
        for name, tensor in torch.load(path)["params"].items():
            copies.setdefault(name, []).append(tensor)
    details = []
    if set(copies) != set(reference):
        details.append(f"the finished nodes hold {len(copies)} of the model's {len(reference)} tensors")
    max_diff = 0.0
    for name, expected in reference.items():
        for copy in copies.get(name, []):
            diff = (copy - expected).abs().max().item() if copy.shape == expected.shape else float("inf")
            max_diff = max(max_diff, diff)
            if not torch.equal(copy, expected):
                details.append(f"{name}: differs by up to {diff:.3g}")
    return {"params_match": not details, "tensors": len(reference),
            "copies": sum(len(c) for c in copies.values()), "max_abs_diff": max_diff, "details": details[:10]}


def run(*, quick: bool = False, progress: Progress | None = None, seed: int = 0, steps: int = 0,
        var_dir: Path | None = None, no_faults: bool = False) -> dict[str, Any]:
    profile = QUICK if quick else FULL
    if no_faults:
        profile = Profile(steps=profile.steps, faults={}, min_gap_s=0.0, timeout_s=profile.timeout_s)
    var_dir = var_dir or REPO_ROOT / "var" / ("chaos-quick" if quick else "chaos-full")
    soak = Soak(profile=profile, seed=seed, steps=steps, var_dir=var_dir, quick=quick)
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    result: dict[str, Any] = {"seed": seed, "quick": quick}
    error = ""
    orphans: list[str] = []
    try:
        soak.start_servers()
        soak.setup_django()
        soak.start_stack()
        soak.submit()
        soak.run_job()
        result["job_ended_s"] = round(time.monotonic() - soak.started, 1)
        orphans = soak.stop_stack_and_count_orphans()
    except (Exception, KeyboardInterrupt) as exc:
        error = f"{type(exc).__name__}: {exc}"
        soak.say(f"soak failed: {error}")
    finally:
        # Servers and every marked process go, whatever happened (the orphan count is taken first).
        try:
            if soak.job is not None and not error:
                result.update(_checks(soak))
        except Exception as exc:
            error = error or f"checks failed: {type(exc).__name__}: {exc}"
        finally:
            soak.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return _report(soak, result, orphans=orphans, error=error)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _checks(soak: Soak) -> dict[str, Any]:
    job = soak.job
    job.refresh_from_db()
    return {
        "job": {"id": job.pk, "status": job.status, "steps_done": job.steps_done, "target_steps": job.target_steps,
                "generations": job.current_generation},
        "notices": check_notices(job, soak.faults),
        "reconfigurations": check_reconfigurations(job),
        "ledger": check_ledger(job),
        "params": check_params(soak, soak.var_dir / "nodes") if job.status == "finished" else
        {"params_match": False, "details": [f"the job is {job.status}"]},
    }


def _report(soak: Soak, result: dict[str, Any], *, orphans: list[str], error: str) -> dict[str, Any]:
    faults = soak.faults
    by_kind = Counter(f.kind for f in faults)
    notices = result.get("notices", {})
    reconf = result.get("reconfigurations", {})
    ledger = result.get("ledger", {})
    params = result.get("params", {})
    job = result.get("job", {})
    duration = round(time.monotonic() - soak.started, 1)
    min_faults = sum(soak.profile.faults.values())
    rows = [
        ("faults injected", f">= {min_faults}", len(faults), len(faults) >= min_faults),
        ("lost notices", 0, notices.get("lost_notices", "-"), notices.get("lost_notices") == 0),
        ("notices processed twice", 0, notices.get("notices_processed_twice", "-"),
         notices.get("notices_processed_twice") == 0),
        ("notices not acted on", 0, notices.get("notices_not_acted_on", "-"), notices.get("notices_not_acted_on") == 0),
        ("webhook replays not idempotent", 0, notices.get("webhook_replays_not_idempotent", "-"),
         notices.get("webhook_replays_not_idempotent") == 0),
        ("double reconfigurations", 0, reconf.get("double_reconfigurations", "-"),
         reconf.get("double_reconfigurations") == 0),
        ("job finished", "finished", job.get("status", "-"), job.get("status") == "finished"),
        ("params match failure-free run", True, params.get("params_match", "-"), params.get("params_match") is True),
        ("ledger gaps or overlaps", 0, ledger.get("ledger_gaps", "-"), ledger.get("ledger_gaps") == 0),
        ("orphan processes", 0, len(orphans) if not error else "-", not error and not orphans),
        ("soak error", "none", error or "none", not error),
    ]
    ok = all(row[3] for row in rows)
    # Not a check of the list: a process that died by itself and was restarted (see Soak.supervise).
    rows.append(("unplanned exits (restarted)", "info", len(soak.unplanned_exits), True))
    print_table(f"Chaos soak ({'quick' if soak.quick else 'full'}, seed {soak.seed}): {len(faults)} faults "
                f"({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))}) in {duration:.0f} s",
                ("check", "expected", "observed", "ok"), [(*row[:3], "yes" if row[3] else "NO") for row in rows])
    for section in ("notices", "reconfigurations", "ledger", "params"):
        for line in result.get(section, {}).get("details", []):
            print(f"  {section}: {line}")
    for line in orphans:
        print(f"  orphan: {line}")
    figures = {
        "ok": ok, "error": error, "seed": soak.seed, "quick": soak.quick, "duration_s": duration,
        "faults_injected": len(faults), "faults_by_kind": dict(by_kind),
        "faults_not_injected": getattr(soak, "not_injected", []),
        "lost_notices": notices.get("lost_notices"), "notices_processed_twice": notices.get("notices_processed_twice"),
        "notices_not_acted_on": notices.get("notices_not_acted_on"), "notices_stored": notices.get("notices_stored"),
        "webhook_replays_not_idempotent": notices.get("webhook_replays_not_idempotent"),
        "double_reconfigurations": reconf.get("double_reconfigurations"),
        "reconfigurations_applied": reconf.get("applied"), "generations": reconf.get("generations"),
        "job_status": job.get("status"), "job_steps": job.get("steps_done"), "target_steps": job.get("target_steps"),
        "job_ended_s": result.get("job_ended_s"),
        "params_match": params.get("params_match"), "params_max_abs_diff": params.get("max_abs_diff"),
        "ledger_gaps": ledger.get("ledger_gaps"), "billed_s": ledger.get("billed_s"),
        "instance_life_s": ledger.get("life_s"), "instances": ledger.get("instances"),
        "orphans": len(orphans) if not error else None, "orphan_processes": orphans,
        "unplanned_exits": soak.unplanned_exits,
        "checks": [{"check": r[0], "expected": r[1], "observed": r[2], "ok": r[3]} for r in rows],
        "faults": [{"index": f.index, "kind": f.kind, "at_s": f.at_s, "at_step": f.at_step, "detail": f.detail,
                    "took_s": f.took_s} for f in faults],
        "details": {s: result.get(s, {}).get("details", []) for s in ("notices", "reconfigurations", "ledger",
                                                                       "params")},
        "load_average": os.getloadavg(),
    }
    return figures


def reference_main(config_path: Path, out: Path) -> int:
    """`python -m bench.chaos --reference CONFIG OUT`: train the job's model in one process, save
    its final parameters. One torch thread: it shares the machine with the soak."""
    import torch

    from runtime.config import JobConfig
    from runtime.train.reference import train_reference

    torch.set_num_threads(1)
    params, _losses = train_reference(JobConfig.from_dict(json.loads(config_path.read_text())))
    tmp = out.with_suffix(".tmp")
    torch.save(params, tmp)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--reference":
        sys.exit(reference_main(Path(sys.argv[2]), Path(sys.argv[3])))
    sys.exit("run it as: python -m bench chaos [--quick]")
