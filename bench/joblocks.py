"""Job locks at fleet size: how long the control plane's work on one big job holds the job's row
lock, and how long a notice waits behind the rest of that work under a sustained mixed load.

Every write to a job's rows takes the job's lock first (`controlplane.fleet.locks`, one lock order),
so on a 1,024-node job anything slow that holds it delays the next notice's reaction. Three parts,
on PostgreSQL (scratch database `BENCH_JOBLOCKS_DB`, default h54), in this process, each load on a
thread and a database connection of its own, calling the services the Celery worker and beat call
(a task's body runs as the worker runs it: `Task.apply`, so reconfigurations are applied inline as
in the notice drain). Nodes come from an in-memory provider: nothing is launched or terminated.

Parts 1 and 2 measure each case `REPEATS` times (3; quick 1), each on a job of its own, and give
the median (every run under `runs` in the JSON).

1. **release**: a finished job of N running nodes (32, 128, 512, 1,024; quick 32, 128) released by
   `capacity_release`; 20 ms into it another connection asks for the job's lock, as a notice batch
   does first. Release time, that lock's wait, growth exponent in N.
   **acquisition**: a new job of N nodes starts: `job_start` requests its capacity (one transaction
   holding the job's lock), `acquisition_launch` launches and attaches the nodes (the provider call,
   then one transaction holding it); the same lock asked for 20 ms into each.
2. **zone reclaim**: K agent notices (1, 8, 64; quick 1, 8, 16) for nodes spread over a running
   recycle job of N nodes (pp=4; 256 and 1,024; quick 256), stored and drained as the worker drains
   them: one batch decided and applied, up to the job's next generation. Baseline: K = 1 on the
   same job size, same run.
3. **mixed load** on one running recycle job of N nodes (1,024; quick 256) for D s (60; quick 8):
   an agent notice a second for a random working node, drained at once (the notice stream), first
   alone (the baseline), then beside beat's periodic work at its production periods (the dead-node
   check every 0.5 s, every job's reconcile every 3 s), every node's heartbeat every 10 s (one
   `UPDATE` per 0.1 s window, as the ASGI fast path writes them), a replacement node joining every
   5 s (`job_grow`) and a zone reclaim of 16 nodes every 10 s. For every operation: how long it took
   to take its locks (the `fleet.locks` log records: the wait behind other transactions plus the
   locking reads) and how long it ran; for the notice stream also store -> next generation.
   Notice pacing is off (`SPOTPIPE_NOTICE_DRAIN_SPACING_S=0`): the figures are the database's
   side; `python -m bench fleet` measures notice -> command through the whole stack.

Output: tables, JSON, plot in var/bench/joblocks/.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import webhooks as wh
from bench.report import Progress, growth_exponent, percentile, print_table

OUT_DIR = Path("var/bench/joblocks")
DB_NAME = os.environ.get("BENCH_JOBLOCKS_DB", "h54")
PP = 4
MICROBATCHES = 4
PROVIDER = "aws"
RELEASE_SIZES, RELEASE_SIZES_QUICK = (32, 128, 512, 1024), (32, 128)
RECLAIM_SIZES, RECLAIM_SIZES_QUICK = (256, 1024), (256,)
RECLAIM_NOTICES, RECLAIM_NOTICES_QUICK = (1, 8, 64), (1, 8, 16)
LOCK_ASK_AFTER_S = 0.02
REPEATS = 3
"""Runs of each single measurement (parts 1-2; the quick run: 1); the tables give their median."""
# The mixed load's operations: name -> (period in seconds, what it is). Periods are production's
# (controlplane/beat.py) where beat sets them.
LOAD = {
    "notice_stream": (1.0, "an agent notice for a random working node, drained at once"),
    "heartbeats": (0.1, "every node's heartbeat every 10 s: one UPDATE of the window's nodes"),
    "detect_dead_agents": (0.5, "beat: nodes whose heartbeats stopped"),
    "reconcile": (3.0, "beat: every active job's reconcile (capacity, unapplied reconfigurations)"),
    "joiner": (5.0, "a replacement node joins (job_grow)"),
    "zone_reclaim": (10.0, "16 agent notices at once, drained as one batch"),
}
HEARTBEAT_PERIOD_S = 10.0
ZONE_NOTICES = 16


def parse_args(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench joblocks")
    parser.add_argument("--load-nodes", type=int, help="nodes of the mixed load's job (default 1024, quick 256)")
    parser.add_argument("--load-s", type=float, help="seconds of each mixed-load phase (default 60, quick 8)")
    return vars(parser.parse_args(argv))


# --- set-up -------------------------------------------------------------------------------------


def _prepare(progress: Progress) -> None:
    import psycopg

    progress.step(f"creating scratch database {DB_NAME}")
    with psycopg.connect(wh.ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    env = wh._env(DATABASE_URL=wh._db_url(DB_NAME), SPOTPIPE_RENDEZVOUS="none", SPOTPIPE_NOTICE_HANDOFF="none",
                  SPOTPIPE_NOTICE_DRAIN_SPACING_S="0", SPOTPIPE_HEARTBEAT_S=str(HEARTBEAT_PERIOD_S),
                  # Long enough that the seeded jobs' idle nodes are never declared dead: the
                  # dead-node check still reads and stamps every run, and declares nobody.
                  SPOTPIPE_HEARTBEAT_TIMEOUT_S="3600")
    progress.step("migrating")
    import subprocess
    import sys

    subprocess.run([wh.PYTHON, "manage.py", "migrate", "-v", "0"], cwd=wh.ROOT, env=env, check=True)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("SPOTPIPE_", "DATABASE_URL", "REDIS_URL",
                                                                      "CELERY_BROKER_URL", "DEBUG", "DJANGO_",
                                                                      "AWS_"))})
    sys.path.insert(0, str(wh.ROOT))
    import django

    django.setup()
    logging.getLogger("celery.app.trace").setLevel(logging.WARNING)  # a line per task would bury the tables
    from controlplane.market.services import catalogue_load
    from controlplane.orchestration.providers import set_provider

    progress.step("loading the catalogue")
    catalogue_load()
    set_provider(PROVIDER, _MemoryProvider())
    # What a Celery worker process does once started (controlplane/celery.py): this process runs
    # the worker's services, so it keeps the worker's heap.
    from controlplane.common.heap import freeze_startup_heap

    freeze_startup_heap()


class _MemoryProvider:
    """Nodes in memory: every known node runs until terminated; launched nodes stay pending (they
    never enrol), as replacements still booting do."""

    kind = PROVIDER

    def __init__(self) -> None:
        self.ended: set[str] = set()
        self.launched: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def launch(self, request: Any) -> list[Any]:
        from controlplane.orchestration.providers import NodeInfo

        with self._lock:
            ids = self.launched.setdefault(
                request.client_token, [f"i-boot{len(self.launched):05d}{n:03d}" for n in range(request.count)])
        pool = request.pools[0]
        return [NodeInfo(provider_instance_id=i, instance_type=pool.instance_type, zone=pool.zone, state="pending")
                for i in ids]

    def describe(self, ids: Sequence[str]) -> list[Any]:
        from controlplane.orchestration.providers import NodeInfo

        return [NodeInfo(provider_instance_id=i, instance_type="p3.2xlarge", zone="",
                         state="terminated" if i in self.ended else "running") for i in ids]

    def terminate(self, ids: Sequence[str]) -> None:
        with self._lock:
            self.ended.update(ids)


_job_counter = iter(range(1, 10**9))


def _submitted_job(nodes: int) -> Any:
    """A submitted (pending) recycle job of `nodes` nodes, dp x pp=4, on the in-memory provider."""
    from controlplane.accounts.models import Team
    from controlplane.jobs.services import job_submit

    team, _ = Team.objects.get_or_create(slug="joblocks", defaults={"name": "Job locks"})
    config = {"model": {"kind": "gpt", "n_layer": 8, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 128},
              "global_batch": nodes // PP * MICROBATCHES}
    job = job_submit(team=team, user=None, config=config, model_spec=None,
                     plan={"dp": nodes // PP, "pp": PP, "provider": PROVIDER, "microbatches": MICROBATCHES,
                           "instance_types": ["p3.2xlarge"]},
                     name=f"joblocks-{next(_job_counter)}", strategy="recycle", target_steps=10**6, budget_usd="100000",
                     allow_over_budget=True)  # endless: the bench ends it
    return job


def _running_job(nodes: int, progress: Progress | None = None) -> tuple[Any, list[Any]]:
    """A running recycle job of `nodes` nodes (dp x pp=4) with its first generation."""
    from django.utils import timezone

    from controlplane.fleet.models import Instance
    from controlplane.jobs.models import TrainingJob
    from controlplane.market.models import InstanceType
    from controlplane.orchestration.services import job_grow

    job = _submitted_job(nodes)
    itype = InstanceType.objects.get(name="p3.2xlarge")
    j = job.pk
    now = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(status="running", started_at=now)
    job.refresh_from_db()
    made = Instance.objects.bulk_create([
        Instance(team_id=job.team_id, job=job, provider=PROVIDER, provider_instance_id=f"i-jl{j:04d}{n:05d}",
                 instance_type=itype, state="running", state_changed_at=now, running_at=now, last_heartbeat_at=now)
        for n in range(nodes)
    ])
    if progress:
        progress.step(f"job of {nodes} nodes: first generation")
    job_grow(job=job)
    job.refresh_from_db()
    return job, made


# --- lock waits, from the product's own records ---------------------------------------------------


class LockWaits(logging.Handler):
    """Collects `controlplane.fleet.locks`' DEBUG records: each transaction's time to take its
    locks, by the thread (one operation per thread) that took them."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.by_thread: dict[str, list[float]] = defaultdict(list)
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        wait = getattr(record, "lock_wait_ms", None)
        if wait is not None:
            with self._guard:
                self.by_thread[record.threadName].append(float(wait))

    def take(self, thread: str) -> list[float]:
        with self._guard:
            return self.by_thread.pop(thread, [])

    def __enter__(self) -> LockWaits:
        log = logging.getLogger("controlplane.fleet.locks")
        self._saved = (log.level, log.propagate)
        log.setLevel(logging.DEBUG)
        log.propagate = False  # the records are for this bench, not the console
        log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        log = logging.getLogger("controlplane.fleet.locks")
        log.removeHandler(self)
        log.setLevel(self._saved[0])
        log.propagate = self._saved[1]


def _median_run(measure: Callable[[], dict[str, Any]], repeats: int) -> dict[str, Any]:
    """`measure` run `repeats` times (each on a job of its own): every figure's median, the runs'
    own figures under `runs` (one run's PostgreSQL commit or a collection can double a figure)."""
    runs = [measure() for _ in range(repeats)]
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        numbers = [r[key] for r in runs]
        out[key] = statistics.median(numbers) if isinstance(value, float) else value
    out["runs"] = runs
    return out


def _summary(values: list[float]) -> dict[str, Any]:
    return {"count": len(values), "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
            "max_ms": max(values) if values else None}


# --- 1. release ----------------------------------------------------------------------------------


def _timed_with_a_lock_asker(job: Any, operation: Callable[[], Any]) -> tuple[Any, float, float]:
    """Run `operation` while another connection asks for `job`'s lock `LOCK_ASK_AFTER_S` into it
    (what a notice batch takes first). Returns (its result, its ms, that lock's wait in ms)."""
    from django.db import connection, transaction

    from controlplane.fleet.locks import lock_job

    waited: list[float] = []

    def ask_for_the_lock() -> None:
        time.sleep(LOCK_ASK_AFTER_S)
        try:
            started = time.perf_counter()
            with transaction.atomic():
                lock_job(job)
                waited.append((time.perf_counter() - started) * 1000.0)
        finally:
            connection.close()

    asker = threading.Thread(target=ask_for_the_lock, name="lock-asker")
    started = time.perf_counter()
    asker.start()
    result = operation()
    took = (time.perf_counter() - started) * 1000.0
    asker.join()
    return result, took, waited[0]


def _release(nodes: int, progress: Progress) -> dict[str, Any]:
    from controlplane.jobs.models import TrainingJob
    from controlplane.orchestration.services import capacity_release

    job, _ = _running_job(nodes)
    TrainingJob.objects.filter(pk=job.pk).update(status="finished")
    job.refresh_from_db()
    progress.step(f"release: {nodes} nodes")
    released, release_ms, waited = _timed_with_a_lock_asker(job, lambda: capacity_release(job=job))
    assert len(released) == nodes, f"released {len(released)} of {nodes} nodes"
    return {"nodes": nodes, "release_ms": release_ms, "lock_wait_ms": waited,
            "release_ms_per_node": release_ms / nodes}


def _acquire(nodes: int, progress: Progress) -> dict[str, Any]:
    """A new job of `nodes` nodes starts: its capacity is requested (one transaction holding the
    job's lock), then launched and attached (the provider call, then one transaction holding it)."""
    from controlplane.orchestration.services import acquisition_launch, job_start

    job = _submitted_job(nodes)
    progress.step(f"acquisition: {nodes} nodes")
    acquisition, request_ms, request_wait = _timed_with_a_lock_asker(job, lambda: job_start(job=job))
    attached, launch_ms, launch_wait = _timed_with_a_lock_asker(
        job, lambda: acquisition_launch(acquisition=acquisition))
    assert len(attached) == nodes, f"attached {len(attached)} of {nodes} nodes"
    _finish(job)
    return {"nodes": nodes, "request_ms": request_ms, "request_lock_wait_ms": request_wait,
            "launch_and_attach_ms": launch_ms, "attach_lock_wait_ms": launch_wait}


def _finish(job: Any) -> None:
    from controlplane.jobs.models import TrainingJob
    from controlplane.orchestration.services import capacity_release

    TrainingJob.objects.filter(pk=job.pk).update(status="finished")
    job.refresh_from_db()
    capacity_release(job=job)


# --- 2. zone reclaim -----------------------------------------------------------------------------


def _notice(instance: Any) -> int:
    from controlplane.orchestration.services import agent_notice

    notice_id = agent_notice(instance=instance, kind="interruption", action="terminate", cloud="aws")
    assert notice_id is not None, f"notice for {instance.provider_instance_id} was a duplicate"
    return notice_id


def _drain() -> None:
    """The worker's drain, run as the worker runs it (reconfigurations applied inline)."""
    from controlplane.orchestration.tasks import drain_notices

    drain_notices.apply().get()


def _generation(job: Any) -> int:
    from controlplane.jobs.models import TrainingJob

    return TrainingJob.objects.values_list("current_generation", flat=True).get(pk=job.pk)


def _spread(members: list[Any], count: int) -> list[Any]:
    """`count` nodes spread evenly over the job's pipelines and stages (node order is slot order)."""
    step = max(1, len(members) // count)
    return [members[(k * step + k % PP) % len(members)] for k in range(count)]


def _reclaim(nodes: int, notices: int, progress: Progress) -> dict[str, Any]:
    job, members = _running_job(nodes)
    before = _generation(job)
    progress.step(f"zone reclaim: {notices} notices of a {nodes}-node job")
    started = time.perf_counter()
    for instance in _spread(members, notices):
        _notice(instance)
    stored = time.perf_counter()
    _drain()
    done = time.perf_counter()
    after = _generation(job)
    assert after == before + 1, f"expected one new generation, got {after - before}"
    _finish(job)  # out of the way of the next parts' reconcile and dead-node check
    return {"nodes": nodes, "notices": notices, "store_ms": (stored - started) * 1000.0,
            "drain_to_generation_ms": (done - stored) * 1000.0, "generations": after - before}


def _silent_loss(nodes: int, lost: int, progress: Progress) -> dict[str, Any]:
    """`lost` nodes of a running job stop heartbeating (a zone gone without notices): the dead-node
    check's service marks them lost and the job reacts."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.fleet.models import Instance
    from controlplane.orchestration.services import instances_detect_dead

    job, members = _running_job(nodes)
    silent = _spread(members, lost)
    now = timezone.now()
    Instance.objects.filter(job=job).update(last_heartbeat_at=now)
    Instance.objects.filter(pk__in=[i.pk for i in silent]).update(last_heartbeat_at=now - timedelta(hours=2))
    before = _generation(job)
    progress.step(f"silent loss: {lost} of a {nodes}-node job's nodes stop heartbeating")
    started = time.perf_counter()
    found = instances_detect_dead(timeout_s=3600, now=now)
    took = (time.perf_counter() - started) * 1000.0
    assert sorted(found) == sorted(i.pk for i in silent), f"found {len(found)} of {lost} silent nodes"
    generations = _generation(job) - before
    _finish(job)
    return {"nodes": nodes, "lost": lost, "detect_to_generation_ms": took, "generations": generations}


# --- 3. mixed load ---------------------------------------------------------------------------------


class _Load:
    """The mixed load's operations on one job, each on a thread of its own at its period."""

    def __init__(self, job: Any, members: list[Any], *, seed: int = 0) -> None:
        self.job = job
        self.working = list(members)
        self.everyone = [m.pk for m in members]
        self.rng = random.Random(seed)
        self.pick = threading.Lock()
        self.durations: dict[str, list[float]] = defaultdict(list)
        self.to_generation: list[float] = []
        self.errors: list[str] = []
        self.heartbeat_cursor = 0
        from controlplane.market.models import InstanceType

        self.instance_type = InstanceType.objects.get(name="p3.2xlarge")

    def _take(self, count: int) -> list[Any]:
        with self.pick:
            chosen = self.rng.sample(self.working, count)
            for node in chosen:
                self.working.remove(node)
            return chosen

    def notice_stream(self) -> None:
        (node,) = self._take(1)
        stored = time.perf_counter()
        _notice(node)
        _drain()
        self.to_generation.append((time.perf_counter() - stored) * 1000.0)

    def zone_reclaim(self) -> None:
        for node in self._take(ZONE_NOTICES):
            _notice(node)
        _drain()

    def heartbeats(self) -> None:
        from django.utils import timezone

        from controlplane.fleet.heartbeats import _stamp

        per_window = max(1, round(len(self.everyone) * LOAD["heartbeats"][0] / HEARTBEAT_PERIOD_S))
        start = self.heartbeat_cursor
        ids = [self.everyone[(start + k) % len(self.everyone)] for k in range(per_window)]
        self.heartbeat_cursor = (start + per_window) % len(self.everyone)
        _stamp(ids, timezone.now())

    def detect_dead_agents(self) -> None:
        from controlplane.orchestration.tasks import detect_dead_agents

        detect_dead_agents.apply().get()

    def reconcile(self) -> None:
        from controlplane.orchestration.services import active_job_ids
        from controlplane.orchestration.tasks import reconcile_job

        for job_id in active_job_ids():
            reconcile_job.apply(args=[job_id]).get()

    def joiner(self) -> None:
        from django.utils import timezone

        from controlplane.fleet.models import Instance
        from controlplane.orchestration.services import job_grow

        now = timezone.now()
        node = Instance.objects.create(
            team_id=self.job.team_id, job=self.job, provider=PROVIDER, instance_type=self.instance_type,
            provider_instance_id=f"i-join{self.rng.randrange(10**9):09d}", state="running", state_changed_at=now,
            running_at=now, last_heartbeat_at=now)
        job_grow(job=self.job, instance=node)
        with self.pick:
            self.working.append(node)
            self.everyone.append(node.pk)

    def run(self, names: list[str], seconds: float, waits: LockWaits) -> dict[str, Any]:
        stop = threading.Event()

        def loop(name: str, period: float, operation: Callable[[], None]) -> None:
            from django.db import connection

            next_at = time.perf_counter()
            try:
                while not stop.is_set():
                    started = time.perf_counter()
                    try:
                        operation()
                    except Exception as exc:  # counted, shown, and fail the run below
                        self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                    self.durations[name].append((time.perf_counter() - started) * 1000.0)
                    next_at += period
                    stop.wait(max(0.0, next_at - time.perf_counter()))
            finally:
                connection.close()

        threads = [threading.Thread(target=loop, name=name, args=(name, LOAD[name][0], getattr(self, name)))
                   for name in names]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} operations failed, e.g. {self.errors[:3]}")
        out = {}
        for name in names:
            out[name] = {"runs": len(self.durations[name]), "duration": _summary(self.durations.pop(name)),
                         "lock_wait": _summary(waits.take(name))}
        out["notice_stream"]["store_to_generation"] = _summary(self.to_generation)
        self.to_generation = []
        return out


def _mixed(nodes: int, seconds: float, progress: Progress) -> dict[str, Any]:
    job, members = _running_job(nodes, progress)
    load = _Load(job, members)
    # One notice first, not measured: a process's first reaction on a job imports and freezes what
    # it lazily needs (controlplane/common/heap.py); the phases measure the steady state.
    load.notice_stream()
    load.to_generation.clear()
    with LockWaits() as waits:
        progress.step(f"mixed load: the notice stream alone on a {nodes}-node job, {seconds:g} s")
        alone = load.run(["notice_stream"], seconds, waits)
        progress.step(f"mixed load: the notice stream beside everything else, {seconds:g} s")
        loaded = load.run(list(LOAD), seconds, waits)
    return {"nodes": nodes, "seconds": seconds, "alone": alone, "loaded": loaded,
            "generation_at_end": _generation(job)}


# --- output --------------------------------------------------------------------------------------


def _plot(release: list[dict], mixed: dict) -> dict[str, str]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    for name in ("kaleido", "choreographer"):  # their INFO lines would bury the table
        logging.getLogger(name).setLevel(logging.WARNING)
    from runtime.sim.plots import write_figure

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "release of a finished job (ms) vs nodes", f"lock wait p99 (ms), {mixed['nodes']}-node job"))
    sizes = [r["nodes"] for r in release]
    fig.add_trace(go.Scatter(x=sizes, y=[r["release_ms"] for r in release], name="release", mode="lines+markers"),
                  1, 1)
    fig.add_trace(go.Scatter(x=sizes, y=[r["lock_wait_ms"] for r in release], name="lock asked 20 ms in",
                             mode="lines+markers"), 1, 1)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    names = list(mixed["loaded"])
    waits = [mixed["alone"]["notice_stream"]["lock_wait"]["p99_ms"],
             *(mixed["loaded"][n]["lock_wait"]["p99_ms"] or 0 for n in names)]
    fig.add_trace(go.Bar(x=["notice_stream (alone)", *names], y=waits, name="lock wait p99"), 1, 2)
    fig.update_layout(width=1300, height=440)
    return write_figure(fig, OUT_DIR, "joblocks")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def run(*, quick: bool = False, progress: Progress | None = None, load_nodes: int | None = None,
        load_s: float | None = None) -> dict[str, Any]:
    progress = progress or Progress()
    _prepare(progress)
    figures: dict[str, Any] = {"database": "postgresql", "scratch_database": DB_NAME}

    repeats = 1 if quick else REPEATS
    release = [_median_run(lambda n=n: _release(n, progress), repeats)
               for n in (RELEASE_SIZES_QUICK if quick else RELEASE_SIZES)]
    figures["release"] = {
        "rows": release,
        "growth_exponent_release_ms_vs_nodes": growth_exponent([(r["nodes"], r["release_ms"]) for r in release]),
    }
    print_table(
        "Releasing a finished job (capacity_release, one transaction holding the job's lock); another connection "
        f"asks for the job's lock {LOCK_ASK_AFTER_S * 1000:g} ms in. Baseline of the ratio: the smallest job",
        ["nodes", "release ms", "ms per node", "lock wait ms", f"release / {release[0]['nodes']} nodes"],
        [[r["nodes"], r["release_ms"], r["release_ms_per_node"], r["lock_wait_ms"],
          r["release_ms"] / release[0]["release_ms"]] for r in release],
    )
    print(f"growth exponent of the release in nodes: {figures['release']['growth_exponent_release_ms_vs_nodes']:.2f}")

    acquire = [_median_run(lambda n=n: _acquire(n, progress), repeats)
               for n in (RELEASE_SIZES_QUICK if quick else RELEASE_SIZES)]
    figures["acquisition"] = {
        "rows": acquire,
        "growth_exponent_request_ms_vs_nodes": growth_exponent([(r["nodes"], r["request_ms"]) for r in acquire]),
        "growth_exponent_launch_and_attach_ms_vs_nodes": growth_exponent(
            [(r["nodes"], r["launch_and_attach_ms"]) for r in acquire]),
    }
    smallest = acquire[0]["request_ms"] + acquire[0]["launch_and_attach_ms"]
    print_table(
        "A new job's nodes: capacity requested (one transaction holding the job's lock), then launched by the "
        "in-memory provider and attached (one transaction holding it); another connection asks for the job's lock "
        f"{LOCK_ASK_AFTER_S * 1000:g} ms into each. Baseline of the ratio: the smallest job",
        ["nodes", "request ms", "its lock wait ms", "launch + attach ms", "its lock wait ms",
         f"request + attach / {acquire[0]['nodes']} nodes"],
        [[r["nodes"], r["request_ms"], r["request_lock_wait_ms"], r["launch_and_attach_ms"], r["attach_lock_wait_ms"],
          (r["request_ms"] + r["launch_and_attach_ms"]) / smallest] for r in acquire],
    )

    # The first reclaim in a process also imports and warms the strategies' planners: not measured.
    _reclaim((RECLAIM_SIZES_QUICK if quick else RECLAIM_SIZES)[0], 1, progress)
    reclaim = []
    for n in RECLAIM_SIZES_QUICK if quick else RECLAIM_SIZES:
        rows = [_median_run(lambda n=n, k=k: _reclaim(n, k, progress), repeats)
                for k in (RECLAIM_NOTICES_QUICK if quick else RECLAIM_NOTICES)]
        for row in rows:
            row["ratio_to_one_notice"] = row["drain_to_generation_ms"] / rows[0]["drain_to_generation_ms"]
        reclaim += rows
    figures["zone_reclaim"] = reclaim
    print_table(
        "A zone reclaims K nodes of one running recycle job (pp=4): K agent notices drained as one batch up to the "
        "job's next generation. Baseline of the ratio: one notice on a job of the same size, same run",
        ["nodes", "notices", "store ms", "drain -> generation ms", "ratio to 1 notice"],
        [[r["nodes"], r["notices"], r["store_ms"], r["drain_to_generation_ms"], r["ratio_to_one_notice"]]
         for r in reclaim],
    )

    silent = [_median_run(lambda n=n, k=k: _silent_loss(n, k, progress), repeats)
              for n in (RECLAIM_SIZES_QUICK if quick else RECLAIM_SIZES)
              for k in (RECLAIM_NOTICES_QUICK if quick else RECLAIM_NOTICES)[1:]]
    figures["silent_loss"] = silent
    print_table(
        "Nodes of one running recycle job stop heartbeating (a zone gone without notices): the dead-node check's "
        "service marks them lost and the job reacts, up to its last new generation. Baseline of the ratio: the "
        "fewest nodes lost on a job of the same size",
        ["nodes", "lost", "detect -> generation ms", "generations published", "ms / fewest lost"],
        [[r["nodes"], r["lost"], r["detect_to_generation_ms"], r["generations"],
          r["detect_to_generation_ms"] / next(x for x in silent if x["nodes"] == r["nodes"])["detect_to_generation_ms"]]
         for r in silent],
    )

    nodes = load_nodes or (256 if quick else 1024)
    seconds = load_s or (8.0 if quick else 60.0)
    mixed = _mixed(nodes, seconds, progress)
    figures["mixed_load"] = mixed
    alone = mixed["alone"]["notice_stream"]
    rows = [["notice_stream, alone (baseline)", alone["runs"], _ms(alone["lock_wait"]["p50_ms"]),
             _ms(alone["lock_wait"]["p99_ms"]), _ms(alone["lock_wait"]["max_ms"]),
             _ms(alone["duration"]["p50_ms"]), _ms(alone["duration"]["p99_ms"]), "1.00"]]
    for name, data in mixed["loaded"].items():
        ratio = "-"
        if name == "notice_stream" and alone["duration"]["p99_ms"]:
            ratio = f"{data['duration']['p99_ms'] / alone['duration']['p99_ms']:.2f}"
        rows.append([name, data["runs"], _ms(data["lock_wait"]["p50_ms"]), _ms(data["lock_wait"]["p99_ms"]),
                     _ms(data["lock_wait"]["max_ms"]), _ms(data["duration"]["p50_ms"]),
                     _ms(data["duration"]["p99_ms"]), ratio])
    print_table(
        f"Mixed load on one running {nodes}-node recycle job, {seconds:g} s a phase: time to take the locks "
        "(waiting plus the locking reads) and run time of each operation. Baseline of the ratio: the notice stream "
        "alone, same run",
        ["operation", "runs", "locks p50 ms", "locks p99 ms", "locks max ms", "run p50 ms", "run p99 ms",
         "run p99 / alone"],
        rows,
    )
    for label, phase in (("alone", mixed["alone"]), ("beside the load", mixed["loaded"])):
        s = phase["notice_stream"]["store_to_generation"]
        print(f"notice stream {label}: store -> next generation p50 {_ms(s['p50_ms'])} ms, "
              f"p99 {_ms(s['p99_ms'])} ms, max {_ms(s['max_ms'])} ms")
    figures["plots"] = _plot(release, mixed)
    for kind, path in figures["plots"].items():
        print(f"{kind}: {path}")
    figures["load_operations"] = {name: {"period_s": period, "what": what} for name, (period, what) in LOAD.items()}
    return figures
