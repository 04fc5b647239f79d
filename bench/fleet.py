"""Fleet benchmark: does the control plane hold a fleet of agents while it takes webhooks?

The production-like stack on loopback: the web server as docker-compose runs it (granian, ASGI,
3 workers, 16 view threads each, `spotpipe.demo.processes.granian_args`) and, as docker-compose runs it
too, the agent channel's own server (the same application, `AGENT_SERVER_WORKERS` workers: the
agents' every request goes there; `--agent-server shared` sends them to the web server instead, as
before 2026-12-01), PostgreSQL (scratch database
`BENCH_FLEET_DB`, default h53) and Redis (`BENCH_REDIS_URL`, default db 13, flushed), a Celery
worker (2 processes, as docker-compose). N simulated agents (bench/_fleet_agents.py: one asyncio
loop, two keep-alive connections each) heartbeat every 10 s and hold 20 s command long-polls, in
jobs of `--job-size` nodes (recycle, pp=4) whose first generation is published as `job_grow` does.

Two phases on the same server, one run:
1. no agents: the webhook bench's burst (bench/_fleet_webhooks.py, its own process): intake rate
   and p99 -- the baseline;
2. N agents: `--notices` agent interruption notices with no webhook load, then the same burst
   beside the agents with as many notices again (`POST /api/v1/agents/notices/`, one job each,
   2 s apart), going the product's way
   (store -> Celery worker decides and applies the reconfiguration -> new generation -> Redis
   wake-up -> held polls answered): webhook intake and p99, heartbeat ingest (rate against the
   offered N/10 s, latency, longest gap between an agent's acknowledged heartbeats: a backlog shows
   as gaps beyond the period), and notice -> new command delivered to every agent of the job.
Targets (issue 20, at 1,024 agents): intake >= 90% of the baseline, webhook p99 < 50 ms, no
heartbeat backlog, notice -> command p99 < 500 ms. Output: table, JSON, plot in var/bench/fleet/.

Where the machine's CPU goes in each window (bench/_cpu_account.py: CPU seconds of each component's
process tree from /proc, and the machine's busy and idle time from /proc/stat): the web server, the
Celery worker, this process (the simulated agents' loop), the webhook load generator, PostgreSQL
(the whole server: other users' queries included) and Redis, during phase 1's burst, phase 2's agents
alone (the 10 s before the first notice), with their notices before the burst, and phase 2's burst
beside the agents -- what bounds each figure."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench import webhooks as wh
from bench._cpu_account import CpuWindow, Root, exited_unreaped, read_processes
from bench._fleet_agents import Fleet, HTTPConnection
from bench.report import Progress, print_table
from spotpipe.demo.processes import AGENT_SERVER_WORKERS

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
OUT_DIR = Path("var/bench/fleet")
DB_NAME = os.environ.get("BENCH_FLEET_DB", "h53")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
FLEET_TEAM = "fleet-team"
WEBHOOK_TARGETS = 200  # instances the webhook burst's notices name (bench.webhooks._seed)
TARGET_INTAKE_RATIO, TARGET_WEBHOOK_P99_MS, TARGET_NOTICE_P99_MS = 0.9, 50.0, 500.0
PP = 4
AGENT_SERVER_LABELS = {  # --agent-server: where the agents' requests go
    "own": "a server of their own (docker-compose's agents service)",
    "shared": "the web server that takes the webhooks",
}
CPU_WINDOWS = {  # key in the JSON: what the window holds
    "no_agents_burst": "phase 1: the webhook burst, no agents",
    "agents_idle": "phase 2: the agents alone (heartbeats, held polls), the 10 s before the first notice",
    "agents_only_with_notices": "phase 2: the agents and their notices, no webhooks",
    "agents_and_burst": "phase 2: the same burst beside the agents, and their notices",
}
CPU_WINDOW_HEADERS = {"no_agents_burst": "no agents + burst", "agents_idle": "agents idle",
                      "agents_only_with_notices": "agents + notices",
                      "agents_and_burst": "agents + burst"}
CPU_COMPONENTS = {  # key prefix in the JSON: what it counts
    "web_server": "granian web server (master and workers)",
    "celery_worker": "Celery worker (master and pool)",
    "simulated_agents": "bench process (the simulated agents' asyncio loop; idle in phase 1)",
    "agent_server": "the agent channel's own granian server (master and workers; none when shared)",
    "webhook_load_generator": "webhook load generator (bench._fleet_webhooks)",
    "postgresql_all_processes": "PostgreSQL (every backend: other users' queries included)",
    "redis": "Redis (redis-server; other users' databases included)",
}


def parse_args(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench fleet")
    parser.add_argument("--agents", type=int, help="simulated agents (default 1024, quick 128)")
    parser.add_argument("--job-size", type=int, default=32, help="nodes per job (a multiple of 4: pp=4)")
    parser.add_argument("--heartbeat-s", type=float, default=10.0, help="each agent's heartbeat period")
    parser.add_argument("--requests", type=int, help="webhook notices per burst (default 6000, quick 1500)")
    parser.add_argument("--connections", type=int, default=8, help="webhook client connections")
    parser.add_argument("--notices", type=int,
                        help="agent notices before the burst, and as many during it (default 8, quick 2)")
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16, help="view threads per web worker")
    parser.add_argument("--agent-server", choices=list(AGENT_SERVER_LABELS), default="own",
                        help="own: the agents reach a server of their own, as docker-compose runs it; shared: the "
                             "web server that takes the webhooks")
    parser.add_argument("--agent-workers", type=int, default=AGENT_SERVER_WORKERS,
                        help="workers of the agents' own server")
    return vars(parser.parse_args(argv))


def _env(**extra: str) -> dict[str, str]:
    return wh._env(DATABASE_URL=wh._db_url(DB_NAME), REDIS_URL=REDIS_URL, CELERY_BROKER_URL=REDIS_URL,
                   # No per-job rendezvous store processes: the bench has no workers to meet.
                   SPOTPIPE_RENDEZVOUS="none", **extra)


def _prepare(progress: Progress) -> None:
    import psycopg
    import redis

    progress.step(f"creating scratch database {DB_NAME}")
    with psycopg.connect(wh.ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    progress.step("migrating")
    subprocess.run([PYTHON, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=_env(), check=True)
    redis.Redis.from_url(REDIS_URL).flushdb()
    os.environ.update({k: v for k, v in _env().items()
                       if k in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DEBUG", "DJANGO_SETTINGS_MODULE",
                                "SPOTPIPE_RENDEZVOUS"}})
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _server_pids() -> tuple[int | None, int | None]:
    """(PostgreSQL's postmaster, redis-server) pids, when they run on this machine: the parent of
    this process's backend, and the pid Redis reports."""
    import redis
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    procs = read_processes()
    postmaster = procs[backend].ppid if backend in procs and procs[backend].comm == "postgres" else None
    redis_pid = int(redis.Redis.from_url(REDIS_URL).info("server")["process_id"])
    return postmaster, redis_pid if redis_pid in procs and procs[redis_pid].comm.startswith("redis") else None


def _cpu_roots(web: subprocess.Popen, agent_web: subprocess.Popen | None, worker: subprocess.Popen,
               burst: subprocess.Popen | None, servers: tuple[int | None, int | None]) -> dict[str, Root]:
    return {"web_server": Root(web.pid), "agent_server": Root(agent_web.pid if agent_web else None),
            "celery_worker": Root(worker.pid),
            # Own threads only: the load generator is this process's child, and counted on its own.
            "simulated_agents": Root(os.getpid(), children=False),
            "webhook_load_generator": Root(burst.pid if burst else None),
            "postgresql_all_processes": Root(servers[0]), "redis": Root(servers[1])}


def _seed_fleet(agents: int, job_size: int, progress: Progress) -> list[tuple[int, int, str]]:
    """Jobs of `job_size` running nodes (dp x pp=4, recycle), each with its first generation, and
    one agent token per node: [(instance id, job id, token)]."""
    from django.utils import timezone

    from controlplane.accounts.models import Team, TokenKind
    from controlplane.accounts.services import api_token_create
    from controlplane.fleet.models import Instance
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.services import job_submit
    from controlplane.market.models import InstanceType
    from controlplane.orchestration.services import job_grow

    team = Team.objects.create(name="Fleet", slug=FLEET_TEAM)
    itype = InstanceType.objects.get(name="p3.2xlarge")
    config = {"model": {"kind": "gpt", "n_layer": 8, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 128},
              "global_batch": 64}
    now = timezone.now()
    out: list[tuple[int, int, str]] = []
    jobs = (agents + job_size - 1) // job_size
    for j in range(jobs):
        size = min(job_size, agents - j * job_size)
        job = job_submit(team=team, user=None, config=config, model_spec=None,
                         plan={"dp": size // PP, "pp": PP, "provider": "aws", "microbatches": 4,
                               "instance_types": ["p3.2xlarge"]},
                         name=f"fleet-{j}", strategy="recycle", target_steps=10**6, budget_usd="1000",
                         allow_over_budget=True)  # endless: the bench ends it
        TrainingJob.objects.filter(pk=job.pk).update(status="running", started_at=now)
        job.refresh_from_db()
        nodes = Instance.objects.bulk_create([
            Instance(team=team, job=job, provider="aws", provider_instance_id=f"i-fleet{j:04d}{n:04d}",
                     instance_type=itype, state="running", state_changed_at=now, running_at=now,
                     last_heartbeat_at=now)
            for n in range(size)
        ])
        job_grow(job=job)
        for node in nodes:
            _, key = api_token_create(team=team, kind=TokenKind.AGENT, instance=node, name=f"agent {node.pk}")
            out.append((node.pk, job.pk, key))
        progress.step(f"seeded job {j + 1}/{jobs} ({size} nodes)", j + 1, jobs)
    return out


def _webhook_burst(port: int, requests: int, connections: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-m", "bench._fleet_webhooks", "--port", str(port), "--requests", str(requests),
         "--connections", str(connections), "--targets", str(WEBHOOK_TARGETS), "--seed", str(seed)],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)


def _burst_result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=600)
    return json.loads(out.strip().splitlines()[-1])


def _wsgi_server_cmd(port: int, workers: int, threads: int) -> list[str]:
    """The web server as it ran before the agent channel (granian's WSGI interface, blocking
    threads): the bridge's cost is the difference of the two no-agent bursts."""
    return [PYTHON, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--blocking-threads", str(threads), "--no-ws", "--workers-kill-timeout", "3",
            "--log-level", "warning", "controlplane.wsgi:application"]


def _wsgi_baseline(requests: int, connections: int, web_workers: int, threads: int, logs: Path) -> dict:
    port = wh._free_port()
    web = wh._start(_wsgi_server_cmd(port, web_workers, threads), _env(), logs / "bench-fleet-web-wsgi.log")
    try:
        wh._wait_ready(port, web)
        wh._warm_up(port, connections)
        return _burst_result(_webhook_burst(port, requests, connections, seed=1))
    finally:
        wh._stop(web)


def _reset_webhook_rows(*, worker_running: bool, drain_timeout_s: float = 300.0) -> None:
    """Phase 2 starts from the state phase 1 found: no notices, the webhook team's nodes running.

    A live worker may still be reacting to the burst: its transactions and the TRUNCATE deadlock, so
    the rows go only once every notice is processed (or failed)."""
    from django.db import connection

    from controlplane.fleet.models import InterruptionNotice, NoticeStatus

    deadline = time.monotonic() + drain_timeout_s
    pending = [NoticeStatus.RECEIVED, NoticeStatus.ENQUEUED]
    while worker_running and InterruptionNotice.objects.filter(status__in=pending).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not finish the burst's notices within {drain_timeout_s:.0f} s")
        time.sleep(0.2)
    with connection.cursor() as cur:
        cur.execute("TRUNCATE fleet_interruptionnotice RESTART IDENTITY CASCADE")
        cur.execute("UPDATE fleet_instance SET state = 'running', notice_at = NULL, ended_at = NULL "
                    "WHERE team_id = (SELECT id FROM accounts_team WHERE slug = %s)", [wh.TEAM])


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def _with_agents(port: int, agent_port: int, agents: list[tuple[int, int, str]], *, heartbeat_s: float,
                       requests: int, connections: int, notices: int, progress: Progress,
                       roots: Callable[[subprocess.Popen | None], dict[str, Root]]) -> dict:
    """The agents' phase: `agent_port` takes the agents' requests (their notices included), `port` the
    webhook burst."""
    fleet = Fleet(agent_port, agents, heartbeat_s=heartbeat_s)
    fleet.start()
    progress.step(f"{len(agents)} agents: waiting for every first answer")
    await asyncio.wait_for(fleet.first_answer.wait(), timeout=300)
    # Let the heartbeats spread over a whole period before measuring.
    cpu, cpu_windows = CpuWindow(), {}
    cpu.begin(roots(None))
    await asyncio.sleep(min(heartbeat_s, 10.0))
    cpu_windows["agents_idle"] = cpu.end(roots(None))
    jobs: dict[int, list[tuple[int, str]]] = {}
    for iid, job, token in agents:
        jobs.setdefault(job, []).append((iid, token))
    order = list(jobs)
    noticed: list[dict[str, Any]] = []
    conn = HTTPConnection(agent_port)

    async def notice(job: int, phase: str) -> None:
        await asyncio.sleep(2.0)
        iid, token = jobs[job][-1]  # a node of the last pipeline's last stage
        generation = max((g or 0) for _, g in fleet.records[iid].answers)
        sent, sent_wall = time.monotonic(), time.time()
        status, _ = await conn.request(
            "POST", "/api/v1/agents/notices/", body=json.dumps({"kind": "interruption", "action": "terminate",
                                                                "cloud": "aws", "raw": {"bench": phase}}).encode(),
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"})
        noticed.append({"job": job, "instance": iid, "sent_at": sent, "sent_wall": sent_wall,
                        "generation_before": generation, "status": status, "phase": phase})
        progress.step(f"agent notice ({phase}) for job {job}: {status}", len(noticed), 2 * notices)

    # Agents only (no webhook load): the channel's own figure.
    cpu.begin(roots(None))
    for job in order[:notices]:
        await notice(job, "quiet")
    await asyncio.sleep(2.0)
    cpu_windows["agents_only_with_notices"] = cpu.end(roots(None))
    cpu.begin(roots(None))
    window_start = time.monotonic()
    burst = _webhook_burst(port, requests, connections, seed=2)
    for job in order[notices:2 * notices]:
        await notice(job, "burst")
    conn.close()
    while not exited_unreaped(burst.pid):  # its CPU is read before it is reaped
        await asyncio.sleep(0.05)
    cpu_windows["agents_and_burst"] = cpu.end(roots(burst))
    burst_figures = _burst_result(burst)
    # Every agent's heartbeat period is covered at least once past the burst; deliveries land.
    await asyncio.sleep(max(3.0, heartbeat_s + 1 - (time.monotonic() - window_start)))
    window_end = time.monotonic()
    await fleet.stop()
    return {"burst": burst_figures, "fleet": fleet, "notices": noticed, "window": (window_start, window_end),
            "cpu": cpu_windows,
            "jobs": {j: [i for i, _ in members] for j, members in jobs.items()}}


def _heartbeat_figures(fleet: Fleet, window: tuple[float, float], heartbeat_s: float) -> dict:
    start, end = window
    latencies, gaps, count, errors = [], [], 0, 0
    for record in fleet.records.values():
        sent = [t for t, _ in record.heartbeats if start <= t <= end]
        latencies += [lat for t, lat in record.heartbeats if start <= t <= end]
        count += len(sent)
        acked = sorted(t + lat for t, lat in record.heartbeats)
        gaps += [b - a for a, b in pairwise(acked) if start <= b <= end]
        errors += record.heartbeat_errors
    seconds = end - start
    return {
        "heartbeats_offered_per_s": round(len(fleet.records) / heartbeat_s, 1),
        "heartbeats_acknowledged_per_s": round(count / seconds, 1),
        "heartbeat_latency_p50_ms": round(_pct(latencies, 0.5) * 1000, 1),
        "heartbeat_latency_p99_ms": round(_pct(latencies, 0.99) * 1000, 1),
        "heartbeat_longest_gap_between_acks_s": round(max(gaps, default=float("nan")), 2),
        "heartbeat_errors": errors,
        "window_s": round(seconds, 1),
    }


def _published_after(notice: dict) -> float | None:
    """Seconds from the notice's POST to the job's next generation (JobGeneration.created_at): the
    control plane's reaction (store, Celery worker decides and applies); the rest is delivery."""
    from controlplane.jobs.models import JobGeneration

    row = JobGeneration.objects.filter(job_id=notice["job"], number__gt=notice["generation_before"]).order_by(
        "number").values_list("created_at", flat=True).first()
    return None if row is None else row.timestamp() - notice["sent_wall"]


REACTION_STAGES = {  # key in the JSON: what the span holds, and the stamps it runs between
    "posted_to_stored": ("the web server stores the notice", "posted", "received_at"),
    "stored_to_claimed": ("it waits for a drain to claim it (kick, Celery queue, the drain's spacing)",
                          "received_at", "enqueued_at"),
    "claimed_to_locked": ("the drain takes the batch's locks (its clock, the row's processed_at, is read then)",
                          "enqueued_at", "processed_at"),
    "locked_to_published": ("the reaction, its commit and the new generation (applied after the commit)",
                            "processed_at", "published"),
}


def _reaction_stages(notice: dict, published: float | None) -> dict[str, float] | None:
    """Where the control plane's reaction to one agent notice went: seconds between the stamps of
    its stored row (and the POST, and the job's next generation: `_published_after`)."""
    from controlplane.fleet.models import InterruptionNotice, NoticeSource

    row = InterruptionNotice.objects.filter(instance_id=notice["instance"], source=NoticeSource.AGENT).order_by(
        "-received_at").values("received_at", "enqueued_at", "processed_at").first()
    if row is None or published is None or any(v is None for v in row.values()):
        return None
    stamps = {"posted": 0.0, "published": published, **{k: v.timestamp() - notice["sent_wall"] for k, v in row.items()}}
    return {key: stamps[end] - stamps[start] for key, (_, start, end) in REACTION_STAGES.items()}


def _notice_figures(fleet: Fleet, noticed: list[dict], jobs: dict[int, list[int]]) -> dict:
    delays, missing, per_notice, reactions, deliveries = [], 0, [], [], []
    stages: dict[str, list[float]] = {key: [] for key in REACTION_STAGES}
    for notice in noticed:
        mine = []
        for iid in jobs[notice["job"]]:
            got = [t for t, g in fleet.records[iid].answers
                   if t >= notice["sent_at"] and (g or 0) > notice["generation_before"]]
            if got:
                mine.append(min(got) - notice["sent_at"])
            else:
                missing += 1
        delays += mine
        published = _published_after(notice)
        if published is not None:
            reactions.append(published)
            deliveries += [d - published for d in mine]
        spent = _reaction_stages(notice, published) or {}
        for key, seconds in spent.items():
            stages[key].append(seconds)
        per_notice.append({"job": notice["job"], "agents": len(jobs[notice["job"]]), "delivered": len(mine),
                           "generation_published_ms": None if published is None else round(published * 1000, 1),
                           **{f"{key}_ms": round(seconds * 1000, 1) for key, seconds in spent.items()},
                           "last_delivery_ms": round(max(mine, default=float("nan")) * 1000, 1),
                           "notice_status": notice["status"]})
    return {
        "notice_to_command_p50_ms": round(_pct(delays, 0.5) * 1000, 1),
        "notice_to_command_p99_ms": round(_pct(delays, 0.99) * 1000, 1),
        "notice_to_command_max_ms": round(max(delays, default=float("nan")) * 1000, 1),
        "notice_to_generation_published_p50_ms": round(_pct(reactions, 0.5) * 1000, 1),
        "notice_to_generation_published_max_ms": round(max(reactions, default=float("nan")) * 1000, 1),
        **{f"{key}_p50_ms": round(_pct(values, 0.5) * 1000, 1) for key, values in stages.items()},
        **{f"{key}_max_ms": round(max(values, default=float("nan")) * 1000, 1) for key, values in stages.items()},
        "generation_published_to_command_p50_ms": round(_pct(deliveries, 0.5) * 1000, 1),
        "generation_published_to_command_p99_ms": round(_pct(deliveries, 0.99) * 1000, 1),
        "agents_affected": sum(len(jobs[n["job"]]) for n in noticed),
        "agents_not_delivered": missing,
        "per_notice": per_notice,
        "delays_ms": [round(d * 1000, 1) for d in sorted(delays)],
    }


def _plot(baseline: dict, loaded: dict, quiet: dict, notice: dict, agents: int) -> dict[str, str]:
    import logging

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    for name in ("kaleido", "choreographer"):  # their INFO lines would bury the table
        logging.getLogger(name).setLevel(logging.WARNING)

    from runtime.sim.plots import write_figure

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "webhook intake (notices/s)", "webhook p99 (ms)", f"notice -> command, {agents} agents (ms, sorted)"))
    labels = ["no agents (baseline)", f"{agents} agents"]
    fig.add_trace(go.Bar(x=labels, y=[baseline["notices_per_s"], loaded["notices_per_s"]], name="intake"), 1, 1)
    fig.add_trace(go.Bar(x=labels, y=[baseline["p99_ms"], loaded["p99_ms"]], name="p99"), 1, 2)
    fig.add_hline(y=TARGET_WEBHOOK_P99_MS, line_dash="dash", row=1, col=2)
    for data, name in ((quiet, "agents only"), (notice, "during the webhook burst")):
        delays = data["delays_ms"]
        fig.add_trace(go.Scatter(x=list(range(len(delays))), y=delays, mode="lines", name=name), 1, 3)
    fig.add_hline(y=TARGET_NOTICE_P99_MS, line_dash="dash", row=1, col=3)
    fig.update_layout(width=1400, height=440)
    return write_figure(fig, OUT_DIR, "fleet")


def run(*, quick: bool = False, progress: Progress | None = None, agents: int | None = None, job_size: int = 32,
        heartbeat_s: float = 10.0, requests: int | None = None, connections: int = 8, notices: int | None = None,
        web_workers: int = 3, threads: int = 16, agent_server: str = "own",
        agent_workers: int = AGENT_SERVER_WORKERS) -> dict:
    from spotpipe.demo.processes import granian_args

    if agent_server not in AGENT_SERVER_LABELS:
        raise ValueError(f"agent_server {agent_server!r} is unknown; expected one of {list(AGENT_SERVER_LABELS)}")
    progress = progress or Progress()
    started_utc, load_at_start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()
    agents = agents or (128 if quick else 1024)
    requests = requests or (1500 if quick else 6000)
    # Each notice goes to a job of its own (half before the burst, half during it).
    notices = min(notices or (2 if quick else 8), max(1, (agents // job_size) // 2))
    _prepare(progress)
    wh._seed(WEBHOOK_TARGETS)
    fleet_agents = _seed_fleet(agents, job_size, progress)
    logs = Path("var/logs")
    logs.mkdir(parents=True, exist_ok=True)
    worker_env = _env()
    progress.step(f"phase 0: webhook burst of {requests} on the WSGI server of before, no agents")
    worker = wh._start([PYTHON, "-m", "celery", "-A", "controlplane", "worker", "-c", "2", "-l", "WARNING",
                        "--prefetch-multiplier", "1", "-n", f"bench-fleet-wsgi-{os.getpid()}@%h"], worker_env,
                       logs / "bench-fleet-worker-wsgi.log")
    try:
        wsgi = _wsgi_baseline(requests, connections, web_workers, threads, logs)
    finally:
        wh._stop(worker)
    _reset_webhook_rows(worker_running=False)
    port = wh._free_port()
    env = _env(SPOTPIPE_WEB_THREADS=str(threads))
    web = wh._start([PYTHON, *granian_args(host="127.0.0.1", port=port, workers=web_workers)], env,
                    logs / "bench-fleet-web.log")
    # Started with the web server, so its idle cost (a Redis subscription, the 1 s fallback read) is in
    # the baseline too, as in production.
    agent_port, agent_web = port, None
    if agent_server == "own":
        agent_port = wh._free_port()
        agent_web = wh._start([PYTHON, *granian_args(host="127.0.0.1", port=agent_port, workers=agent_workers)],
                              env, logs / "bench-fleet-agents.log")
    worker = wh._start([PYTHON, "-m", "celery", "-A", "controlplane", "worker", "-c", "2", "-l", "WARNING",
                        "--prefetch-multiplier", "1", "-n", f"bench-fleet-{os.getpid()}@%h"], env,
                       logs / "bench-fleet-worker.log")
    try:
        wh._wait_ready(port, web)
        wh._warm_up(port, connections)
        if agent_web is not None:
            wh._wait_ready(agent_port, agent_web)
        progress.step(f"phase 1: webhook burst of {requests}, no agents")
        servers = _server_pids()
        cpu = CpuWindow()
        cpu.begin(_cpu_roots(web, agent_web, worker, None, servers))
        burst = _webhook_burst(port, requests, connections, seed=1)
        while not exited_unreaped(burst.pid):  # its CPU is read before it is reaped
            time.sleep(0.05)
        cpu_windows = {"no_agents_burst": cpu.end(_cpu_roots(web, agent_web, worker, burst, servers))}
        baseline = _burst_result(burst)
        _reset_webhook_rows(worker_running=True)
        progress.step(f"phase 2: {agents} agents + the same burst + {notices} agent notices")
        loaded = asyncio.run(_with_agents(port, agent_port, fleet_agents, heartbeat_s=heartbeat_s,
                                          requests=requests, connections=connections, notices=notices,
                                          progress=progress,
                                          roots=lambda burst: _cpu_roots(web, agent_web, worker, burst, servers)))
        cpu_windows.update(loaded["cpu"])
    finally:
        wh._stop(worker)
        wh._stop(web)
        if agent_web is not None:
            wh._stop(agent_web)
    fleet = loaded["fleet"]
    heart = _heartbeat_figures(fleet, loaded["window"], heartbeat_s)
    quiet = _notice_figures(fleet, [n for n in loaded["notices"] if n["phase"] == "quiet"], loaded["jobs"])
    notice = _notice_figures(fleet, [n for n in loaded["notices"] if n["phase"] == "burst"], loaded["jobs"])
    burst = loaded["burst"]
    poll_errors = sum(r.poll_errors for r in fleet.records.values())
    ratio = burst["notices_per_s"] / baseline["notices_per_s"] if baseline["notices_per_s"] else float("nan")
    figures: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, shared with other engineers' sessions (load average at the start "
                   f"{load_at_start[0]:.1f}, at the end {os.getloadavg()[0]:.1f})",
        "started_utc": started_utc,
        "load_average_1_5_15_at_start": [round(x, 2) for x in load_at_start],
        "agents": agents, "job_size": job_size, "heartbeat_period_s": heartbeat_s, "webhook_requests": requests,
        "webhook_connections": connections, "web_workers": web_workers, "view_threads_per_worker": threads,
        "server": "granian --interface asgi controlplane.asgi:application (docker-compose's)",
        "agent_server": agent_server,
        "agent_server_workers": agent_workers if agent_server == "own" else None,
        "webhooks_no_agents_wsgi_server_before": wsgi,
        "webhooks_no_agents": baseline,
        "webhook_intake_ratio_asgi_vs_wsgi_server_no_agents": round(
            baseline["notices_per_s"] / wsgi["notices_per_s"], 3) if wsgi["notices_per_s"] else None,
        "webhooks_with_agents": burst,
        "webhook_intake_ratio_with_agents_vs_no_agents": round(ratio, 3),
        "heartbeats_with_agents": heart,
        "notice_to_command_with_agents_no_webhooks": quiet,
        "notice_to_command_with_agents_during_webhook_burst": notice,
        "command_poll_errors": poll_errors,
        "cpu_by_component": {
            "how": "CPU seconds (utime+stime from /proc/<pid>/stat, each component's process tree, reaped "
                   "children included) over each window, and as cores (CPU s / window s); machine busy and idle "
                   "from /proc/stat; other_processes = machine busy minus the components (other sessions on a "
                   "shared machine). Windows: " + "; ".join(f"{k} = {v}" for k, v in CPU_WINDOWS.items())
                   + " (the burst windows run from the load generator's start to its exit)",
            "components": CPU_COMPONENTS,
            **cpu_windows,
        },
        "targets": {"webhook_intake_ratio_min": TARGET_INTAKE_RATIO, "webhook_p99_ms_max": TARGET_WEBHOOK_P99_MS,
                    "notice_to_command_p99_ms_max": TARGET_NOTICE_P99_MS},
        "met": {
            "webhook_intake_within_10pct": ratio >= TARGET_INTAKE_RATIO,
            "webhook_p99_under_50ms_with_agents": burst["p99_ms"] < TARGET_WEBHOOK_P99_MS,
            "heartbeats_without_backlog": heart["heartbeat_longest_gap_between_acks_s"] < heartbeat_s * 1.5
            and heart["heartbeat_errors"] == 0,
            "notice_to_command_p99_under_500ms_no_webhooks": quiet["notice_to_command_p99_ms"] < TARGET_NOTICE_P99_MS
            and quiet["agents_not_delivered"] == 0,
            "notice_to_command_p99_under_500ms_during_webhook_burst":
                notice["notice_to_command_p99_ms"] < TARGET_NOTICE_P99_MS and notice["agents_not_delivered"] == 0,
        },
    }
    figures["plots"] = _plot(baseline, burst, quiet, notice, agents)
    _print(figures)
    return figures


def _print(f: dict) -> None:
    base, load, heart = f["webhooks_no_agents"], f["webhooks_with_agents"], f["heartbeats_with_agents"]
    old = f["webhooks_no_agents_wsgi_server_before"]
    print_table(
        "the server before (granian WSGI, blocking threads) and now (granian ASGI + thread-pool bridge), no agents; "
        "baseline = WSGI, same run",
        ["figure", "WSGI server (baseline)", "ASGI server", "ASGI / WSGI"],
        [["webhook intake (notices/s)", old["notices_per_s"], base["notices_per_s"],
          f"{base['notices_per_s'] / old['notices_per_s']:.2f}x"],
         ["webhook p50 (ms)", old["p50_ms"], base["p50_ms"], f"{base['p50_ms'] / old['p50_ms']:.2f}x"],
         ["webhook p99 (ms)", old["p99_ms"], base["p99_ms"], f"{base['p99_ms'] / old['p99_ms']:.2f}x"]],
    )
    quiet, notice = (f["notice_to_command_with_agents_no_webhooks"],
                     f["notice_to_command_with_agents_during_webhook_burst"])
    ratio = f["webhook_intake_ratio_with_agents_vs_no_agents"]
    print_table(
        f"bench fleet: {f['agents']} agents (jobs of {f['job_size']}, heartbeat every {f['heartbeat_period_s']} s) "
        f"beside the webhook burst, the agents on {AGENT_SERVER_LABELS[f['agent_server']]}; baseline = the same "
        f"burst with no agents, same servers, same run. "
        f"{f['machine']}",
        ["figure", "target", "no agents (baseline)", f"{f['agents']} agents", "agents / baseline"],
        [
            ["webhook intake (notices/s)", ">= 0.9x baseline", base["notices_per_s"], load["notices_per_s"],
             f"{ratio:.2f}x"],
            ["webhook p50 (ms)", "", base["p50_ms"], load["p50_ms"], f"{load['p50_ms'] / base['p50_ms']:.2f}x"],
            ["webhook p99 (ms)", "< 50", base["p99_ms"], load["p99_ms"], f"{load['p99_ms'] / base['p99_ms']:.2f}x"],
            ["heartbeats acknowledged / offered (per s)", "= offered", "-",
             f"{heart['heartbeats_acknowledged_per_s']} / {heart['heartbeats_offered_per_s']}", "-"],
            ["heartbeat p50 / p99 (ms)", "", "-",
             f"{heart['heartbeat_latency_p50_ms']} / {heart['heartbeat_latency_p99_ms']}", "-"],
            ["longest gap between an agent's acked heartbeats (s)", f"~{f['heartbeat_period_s']}", "-",
             heart["heartbeat_longest_gap_between_acks_s"], "-"],
            *_notice_rows(quiet, "agents only, no webhooks"),
            *_notice_rows(notice, "during the webhook burst"),
        ],
    )
    _print_cpu(f["cpu_by_component"])
    print("met: " + ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in f["met"].items()))
    print(f"plot: {f['plots']}")


def _print_cpu(cpu: dict) -> None:
    windows = [w for w in CPU_WINDOWS if w in cpu]

    def cell(w: str, key: str) -> str:
        return f"{cpu[w][key + '_cpu_s']:.1f} / {cpu[w][key + '_cores']:.2f}"

    rows = [[label, *(cell(w, key) for w in windows)] for key, label in CPU_COMPONENTS.items()]
    rows += [
        ["all of the above", *(cell(w, "components_total") for w in windows)],
        ["other processes (machine busy minus the above), cores", *(cpu[w]["other_processes_cores"] for w in windows)],
        ["machine busy, cores", *(cpu[w]["machine_busy_cores"] for w in windows)],
        ["machine idle, cores (share)", *(f"{cpu[w]['machine_idle_cores']:.2f} ({cpu[w]['machine_idle_share']:.0%})"
                                          for w in windows)],
        ["window (s)", *(cpu[w]["window_s"] for w in windows)],
    ]
    cores = cpu[windows[0]]["cores"] if windows else "?"
    print_table(f"where the CPU went: CPU s / cores of {cores} per window (PostgreSQL and Redis: the whole "
                "servers, other users' work included)", ["component", *(CPU_WINDOW_HEADERS[w] for w in windows)], rows)


def _notice_rows(n: dict, label: str) -> list[list[Any]]:
    return [
        [f"notice -> command at every agent of the job, {label}: p50 / p99 / max (ms)", "p99 < 500", "-",
         f"{n['notice_to_command_p50_ms']} / {n['notice_to_command_p99_ms']} / {n['notice_to_command_max_ms']}", "-"],
        ["  of which notice -> generation published (Celery reaction), p50 / max (ms)", "", "-",
         f"{n['notice_to_generation_published_p50_ms']} / {n['notice_to_generation_published_max_ms']}", "-"],
        *[[f"    {what}: p50 / max (ms)", "", "-", f"{n[f'{key}_p50_ms']} / {n[f'{key}_max_ms']}", "-"]
          for key, (what, _, _) in REACTION_STAGES.items()],
        ["  of which generation published -> command at the agent, p50 / p99 (ms)", "", "-",
         f"{n['generation_published_to_command_p50_ms']} / {n['generation_published_to_command_p99_ms']}", "-"],
        ["  agents not delivered / affected", "0", "-", f"{n['agents_not_delivered']} / {n['agents_affected']}", "-"],
    ]
