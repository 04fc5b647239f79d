"""Webhook ingest benchmark: the real server (granian, PostgreSQL, Redis, a Celery worker) on
loopback, driven by a bounded burst of EventBridge spot notices with 20% duplicates.

Variants, each against the same server code and a fresh set of rows:
- `batched`: the default hand-off (idempotent insert + coalesced kick; workers drain in batches);
- `batched_nice`: the same, with the Celery worker at nice 10 (ingest has the CPU first when the
  web server and the worker share the machine, as here);
- `batched_gunicorn`: `batched` on gunicorn (gthread workers), the web server the product ran
  before granian: the baseline for the server's share;
- `per_request`: the baseline, one Celery publish per stored notice (`process_notice.delay`);
- `insert_only`: no hand-off at all (the sweep picks up the rows later): the ingest ceiling;
- `parse_only`: a route that only reads and parses the body (mounted when
  SPOTPIPE_BENCH_ENDPOINTS=1): what this server costs per request at best.

The server: granian's ASGI workers, `--threads` view threads each (SPOTPIPE_WEB_THREADS), and
keep-alive (as docker-compose runs it, `spotpipe.demo.processes.granian_args`), or gunicorn (`--server
gunicorn`, or a variant's `_gunicorn` suffix) with gthread workers and keep-alive, or sync workers
(`--worker-class sync`, one connection per request). The client: wrk with bench/webhooks_wrk.lua
over keep-alive connections when wrk is installed (Debian's `wrk`), else the Python client (one
connection per request); `--client` chooses, and the table and JSON say which client produced the
figures. Every server process is warmed up (a few hundred requests that write nothing) before the
clock starts.

Figures: notices/s sustained by the burst, p50/p99 time to the 2xx, rows stored, rows processed,
notices lost (answered 2xx but not stored, or not processed in the bound), duplicates acted on
(a duplicate that made a row, or a notice that reacted twice), and the time from storing a notice
to its reaction, under the burst and on a quiet system; CPU per request of the web server, per
notice of the worker, and per request of the client.

Needs PostgreSQL and Redis on this machine: `BENCH_DATABASE_ADMIN_URL` (default
postgres://postgres@127.0.0.1:5432/postgres) to create the scratch database
`spotpipe_bench_webhooks`, and `BENCH_REDIS_URL` (default redis://127.0.0.1:6379/13, a scratch
Redis database that is flushed)."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench._cpu_account import CLK_TCK, read_processes
from bench.report import Progress, print_table

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent
DB_NAME = "spotpipe_bench_webhooks"
ADMIN_URL = os.environ.get("BENCH_DATABASE_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
TEAM = "bench-team"
API_KEY = "sp_wh_bench-key-not-secret"
TARGET_RATE, TARGET_P99_MS = 1000.0, 50.0
DEFAULT_VARIANTS = "parse_only,insert_only,batched,batched_nice,batched_gunicorn,per_request"
SERVERS = ("granian", "gunicorn")


def parse_args(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench webhooks")
    parser.add_argument("--requests", type=int, help="requests per variant (default 6000, quick 2000)")
    parser.add_argument("--connections", type=int, default=8, help="concurrent client connections")
    parser.add_argument("--web-workers", type=int, default=3, help="web server worker processes")
    parser.add_argument("--server", choices=list(SERVERS), default="granian",
                        help="HTTP server of variants without a server suffix: granian (the product's) or gunicorn")
    parser.add_argument("--worker-class", choices=["gthread", "sync"], default="gthread",
                        help="gunicorn worker class: gthread keeps connections alive, sync closes each one")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn gthread or granian worker")
    parser.add_argument("--client", choices=["auto", "wrk", "python"], default="auto",
                        help="load generator: wrk (keep-alive, Lua script) when installed, else the Python client")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help="comma-separated; a suffix _granian or _gunicorn runs that variant on that server")
    return vars(parser.parse_args(argv))


def requirements(*, quick: bool, server: str = "granian", variants: str = DEFAULT_VARIANTS, client: str = "auto",
                 **_options: object) -> list[str]:
    """What this run needs that is not installed, each with how to install it (empty: all there)."""
    missing = []
    servers = {_split_server(v.strip(), server)[1] for v in variants.split(",") if v.strip()}
    if "gunicorn" in servers and not (BIN / "gunicorn").exists():
        missing.append(f"gunicorn (for the _gunicorn variants) at {BIN / 'gunicorn'}: pip install -e '.[dev]'")
    if not (BIN / "celery").exists():
        missing.append(f"celery at {BIN / 'celery'}: pip install -e '.[dev]'")
    if client == "wrk" and not _wrk_binary():
        missing.append("wrk (--client wrk): make bench-tools, or apt-get install wrk")
    return missing


def _db_url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=_db_url(DB_NAME),
        REDIS_URL=REDIS_URL,
        CELERY_BROKER_URL=REDIS_URL,
        DEBUG="false",
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        PYTHONPATH=str(ROOT),
        # The reaction may reach the cloud provider (acquiring a replacement). Keep every such
        # call on loopback: a closed local port as the EC2 endpoint, dummy credentials, and no
        # instance-metadata credential lookup.
        SPOTPIPE_AWS_ENDPOINT_URL="http://127.0.0.1:9",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_EC2_METADATA_DISABLED="true",
        SPOTPIPE_PULL_SPOT_PRICES="0",
        # The whole burst comes from one loopback address; the per-IP limit (6,000 a minute by
        # default) would refuse it after 6 s. The limiter still runs on every request.
        SPOTPIPE_RATELIMIT_WEBHOOKS="1000000000",
    )
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- set-up -----------------------------------------------------------------------------------


def _prepare_database(progress: Progress) -> None:
    import psycopg

    progress.step(f"creating scratch database {DB_NAME}")
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    progress.step("migrating")
    subprocess.run([PYTHON, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=_env(), check=True)
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


def _django() -> None:
    """Configure Django in this process against the scratch database (to seed and to count)."""
    os.environ.update(
        {
            k: v
            for k, v in _env().items()
            if k in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DEBUG", "DJANGO_SETTINGS_MODULE"}
        }
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _seed(instances: int) -> list[str]:
    """A team with an EventBridge API key and `instances` running spot instances in jobs of 8."""
    from decimal import Decimal

    from django.utils import timezone

    from controlplane.accounts.models import Team
    from controlplane.fleet.models import Instance
    from controlplane.jobs.models import TrainingJob
    from controlplane.market.models import Cloud, InstanceType
    from controlplane.webhooks.credentials import credential_create

    team = Team.objects.create(name="Bench", slug=TEAM)
    credential_create(team=team, source="aws_eventbridge", scheme="api_key", header_name="x-api-key", secret=API_KEY)
    cloud, _ = Cloud.objects.get_or_create(code="aws", defaults={"name": "Amazon Web Services"})
    itype, _ = InstanceType.objects.get_or_create(
        cloud=cloud,
        name="p3.2xlarge",
        defaults={
            "vcpus": 8,
            "memory_gib": Decimal(61),
            "accelerator_name": "V100",
            "accelerator_count": 1,
            "on_demand_price": Decimal("3.06"),
        },
    )
    now = timezone.now()
    jobs = TrainingJob.objects.bulk_create(
        [
            TrainingJob(
                team=team,
                name=f"bench-{j}",
                config={"model": {"kind": "mlp", "n_layer": 4}},
                strategy="recycle",
                target_steps=100,
                budget_usd=Decimal(10),  # a row written directly: no submission, no budget check
                status="running",
            )
            for j in range((instances + 7) // 8)
        ]
    )
    ids = [f"i-{n:017x}" for n in range(instances)]
    Instance.objects.bulk_create(
        [
            Instance(
                team=team,
                job=jobs[n // 8],
                provider="aws",
                provider_instance_id=pid,
                instance_type=itype,
                state="running",
                state_changed_at=now,
                running_at=now,
            )
            for n, pid in enumerate(ids)
        ]
    )
    return ids


def _reset_rows() -> None:
    """Forget the previous variant's notices and reactions; every instance runs again."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "TRUNCATE fleet_interruptionnotice, jobs_jobevent, jobs_reconfiguration, fleet_instanceevent "
            "RESTART IDENTITY CASCADE"
        )
        cur.execute("UPDATE fleet_instance SET state = 'running', notice_at = NULL, ended_at = NULL")


# --- the notice stream -----------------------------------------------------------------------


def _event(instance_id: str, rng: random.Random) -> dict:
    roll = rng.random()
    base = {
        "version": "0",
        "id": str(uuid.UUID(int=rng.getrandbits(128))),
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-20T14:02:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1b:instance/{instance_id}"],
    }
    if roll < 0.6:
        return {
            **base,
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    if roll < 0.85:
        return {**base, "detail-type": "EC2 Instance Rebalance Recommendation", "detail": {"instance-id": instance_id}}
    return {
        **base,
        "detail-type": "EC2 Instance State-change Notification",
        "detail": {"instance-id": instance_id, "state": "shutting-down"},
    }


def _request(port: int, body: bytes, path: str = f"/api/v1/webhooks/aws/eventbridge/{TEAM}/") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nx-api-key: {API_KEY}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def _stream(n: int, instance_ids: list[str], seed: int) -> tuple[list[dict], int]:
    """`n` events, 20% of them re-sends of earlier ones; 10% of the unique ones for unknown VMs."""
    rng = random.Random(seed)
    unique = n - n // 5
    events = []
    for _ in range(unique):
        iid = rng.choice(instance_ids) if rng.random() < 0.9 else f"i-unknown{rng.getrandbits(40):010x}"
        events.append(_event(iid, rng))
    # A re-send may arrive before or after its first copy, as with retries over two channels.
    stream = events + [rng.choice(events) for _ in range(n - unique)]
    rng.shuffle(stream)
    return stream, unique


def _send(port: int, request: bytes) -> tuple[int, float]:
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    elapsed = time.perf_counter() - started
    head = b"".join(chunks)[:12]
    return (int(head[9:12]) if head.startswith(b"HTTP/") else 0), elapsed


def _burst(port: int, requests: list[bytes], connections: int, time_cap_s: float) -> dict:
    """Closed loop: `connections` client threads, each sending its next request on answer."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    taken: list[int] = []
    lock = threading.Lock()
    cursor = iter(range(len(requests)))
    deadline = time.monotonic() + time_cap_s

    def client() -> None:
        local_lat, local_status = [], {}
        while time.monotonic() < deadline:
            with lock:
                i = next(cursor, None)
                if i is not None:
                    taken.append(i)
            if i is None:
                break
            try:
                status, elapsed = _send(port, requests[i])
            except OSError:
                status, elapsed = 0, 0.0
            local_status[status] = local_status.get(status, 0) + 1
            if status:
                local_lat.append(elapsed)
        with lock:
            latencies.extend(local_lat)
            for k, v in local_status.items():
                statuses[k] = statuses.get(k, 0) + v

    threads = [threading.Thread(target=client) for _ in range(connections)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    sent = sum(statuses.values())

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    return {
        "sent": sent,
        "elapsed_s": round(elapsed, 3),
        "notices_per_s": round(sent / elapsed, 1),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "statuses": statuses,
        "taken": taken,
    }


WRK_SCRIPT = Path(__file__).resolve().parent / "webhooks_wrk.lua"
PARSE_ONLY_PATH = "/api/v1/webhooks/bench/parse-only/"


def _wrk_binary() -> str | None:
    return shutil.which("wrk")


def _burst_wrk(port: int, bodies: list[bytes], path: str, connections: int, time_cap_s: float, work: Path) -> dict:
    """The same burst sent by wrk over keep-alive connections: each wrk thread sends its share of
    the stream exactly once (bench/webhooks_wrk.lua), and stops once every request of its share is
    answered. Less client CPU per request than the Python client, and no connection set-up per
    request."""
    threads = max(1, min(2, connections))
    work.mkdir(parents=True, exist_ok=True)
    for n in range(threads):
        (work / f"stream-{n + 1}.txt").write_bytes(b"\n".join(bodies[n::threads]) + b"\n")
    env = dict(
        os.environ,
        SPOTPIPE_WRK_STREAM_DIR=str(work),
        SPOTPIPE_WRK_PATH=path,
        SPOTPIPE_WRK_API_KEY=API_KEY,
        SPOTPIPE_WRK_FILLER_PATH=PARSE_ONLY_PATH,
        SPOTPIPE_WRK_COUNT_PARSED="1" if path == PARSE_ONLY_PATH else "0",
    )
    cmd = [_wrk_binary() or "wrk", "-t", str(threads), "-c", str(connections), "-d", f"{int(time_cap_s)}s",
           "--timeout", "10s", "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}/"]
    for marker in work.glob("done-*"):
        marker.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # wrk runs for its whole -d even when every thread has stopped; each thread leaves a marker
    # once all its requests are answered, and SIGINT makes wrk report at once.
    deadline = time.monotonic() + time_cap_s
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list(work.glob("done-*"))) >= threads:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=time_cap_s + 30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    result = json.loads(line.removeprefix("WRK_RESULT "))
    elapsed = (result["burst_us"] or result["duration_us"]) / 1e6
    lat = result["latency_us"]
    statuses = {int(code): n for code, n in result["statuses"].items()}
    # On the parse-only route a filler's answer cannot be told from the stream's: drop the extras.
    extra = max(0, result["answered"] - len(bodies))
    if extra:
        statuses[200] -= extra
    answered = result["answered"] - extra
    unanswered = len(bodies) - answered
    if unanswered:
        statuses[0] = statuses.get(0, 0) + unanswered
    return {
        "sent": len(bodies),
        "elapsed_s": round(elapsed, 3),
        "notices_per_s": round(answered / elapsed, 1),
        "p50_ms": round(lat["p50"] / 1000, 2),
        "p99_ms": round(lat["p99"] / 1000, 2),
        "max_ms": round(lat["max"] / 1000, 2),
        "statuses": statuses,
        "taken": list(range(len(bodies))),
        "wrk_fillers": result["fillers"],
        "wrk_threads": result["threads"],
        "wrk_errors": result["errors"],
        "client_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    }


# --- processes ---------------------------------------------------------------------------------


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    handle = log.open("w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _session_cpu_s(session_id: int) -> float:
    """User+system CPU seconds of every live process in a session (gunicorn master and workers;
    celery and its pool). Independent of what else loads the machine."""
    return sum(p.own_ticks for p in read_processes().values() if p.session == session_id) / CLK_TCK


def _wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the web server exited with {proc.returncode}; see var/logs/bench-webhooks-web.log")
        try:
            _send(
                port,
                f"GET /api/v1/webhooks/aws/eventbridge/{TEAM}/ HTTP/1.1\r\nHost: x\r\n"
                "Connection: close\r\n\r\n".encode(),
            )
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the web server did not start")


def _warm_up(port: int, connections: int, rounds: int = 25) -> None:
    """Bring every server process and thread past its first request (URL configuration, views,
    credentials cache, database connection) before the clock starts: requests that are answered
    without writing anything (the parse-only route, and an EventBridge event of an unknown type,
    which passes authentication and is refused with 400)."""
    parse = _request(port, b'{"warm": "up"}', PARSE_ONLY_PATH)
    refused = _request(port, json.dumps({"version": "0", "id": "warm-up", "detail-type": "warm-up",
                                         "source": "aws.ec2", "detail": {}}).encode())
    _burst(port, [parse, refused] * (connections * rounds), connections * 2, time_cap_s=60)


def _counts() -> dict[str, Any]:
    from django.db.models import Count

    from controlplane.fleet.models import InterruptionNotice
    from controlplane.jobs.models import JobEvent, Reconfiguration

    stored = InterruptionNotice.objects.count()
    processed = InterruptionNotice.objects.filter(status="processed").count()
    twice = JobEvent.objects.values("data__notice").annotate(n=Count("id")).filter(n__gt=1).count()
    reconf_twice = Reconfiguration.objects.values("job", "instance").annotate(n=Count("id")).filter(n__gt=1).count()
    return {"stored": stored, "processed": processed, "reacted_twice": twice + reconf_twice}


def _reaction_latencies() -> tuple[float, float]:
    from controlplane.fleet.models import InterruptionNotice

    rows = InterruptionNotice.objects.filter(status="processed").values_list("received_at", "processed_at")
    lat = sorted((p - r).total_seconds() for r, p in rows)
    if not lat:
        return float("nan"), float("nan")
    return round(lat[len(lat) // 2], 3), round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3)


def _wait_processed(expected: int, timeout_s: float, progress: Progress, label: str) -> float:
    from controlplane.celery import app as celery_app

    started = last_sweep = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if time.monotonic() - last_sweep >= 5.0:
            celery_app.send_task("fleet.sweep_notices")  # what beat sends every 5 s
            last_sweep = time.monotonic()
        counts = _counts()
        progress.step(f"{label}: processed {counts['processed']}/{expected}", counts["processed"], expected)
        if counts["processed"] >= expected:
            break
        time.sleep(0.5)
    return time.monotonic() - started


def _quiet_path(port: int, instance_ids: list[str], n: int) -> dict:
    """Single notices on an idle system, spaced out: store-to-reaction time when nothing queues."""
    from controlplane.fleet.models import InterruptionNotice

    rng = random.Random(7)
    lat = []
    for i in range(n):
        event = _event(instance_ids[i], rng)
        event["detail-type"] = "EC2 Spot Instance Interruption Warning"
        event["detail"] = {"instance-id": instance_ids[i], "instance-action": "terminate"}
        _send(port, _request(port, json.dumps(event).encode()))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = (
                InterruptionNotice.objects.filter(cloud_event_id=event["id"], status="processed")
                .values_list("received_at", "processed_at")
                .first()
            )
            if row:
                lat.append((row[1] - row[0]).total_seconds())
                break
            time.sleep(0.005)
        time.sleep(0.3)  # let the kicker's window pass: each notice arrives after a quiet period
    lat.sort()
    return {
        "quiet_notices": n,
        "quiet_reacted": len(lat),
        "quiet_reaction_p50_ms": round(lat[len(lat) // 2] * 1000, 1) if lat else None,
        "quiet_reaction_max_ms": round(lat[-1] * 1000, 1) if lat else None,
    }


def _split_server(name: str, default: str) -> tuple[str, str]:
    """`batched_gunicorn` -> (`batched`, `gunicorn`); a name without a server suffix runs on `default`."""
    for server in SERVERS:
        if name.endswith(f"_{server}"):
            return name.removesuffix(f"_{server}"), server
    return name, default


def _server_cmd(port: int, *, server: str, web_workers: int, worker_class: str, threads: int) -> list[str]:
    if server == "granian":
        from spotpipe.demo.processes import granian_args

        return [PYTHON, *granian_args(host="127.0.0.1", port=port, workers=web_workers)]
    cmd = [str(BIN / "gunicorn"), "controlplane.wsgi:application", "-b", f"127.0.0.1:{port}",
           "-w", str(web_workers), "-k", worker_class, "--backlog", "2048", "--log-level", "warning"]
    if worker_class == "gthread":
        # Threads per process, and connections kept open between requests (what a load balancer or
        # a cloud's HTTP client does): no TCP set-up and teardown per notice.
        cmd += ["--threads", str(threads), "--keep-alive", "30"]
    return cmd


def _server_label(server: str, web_workers: int, worker_class: str, threads: int) -> str:
    if server == "granian":
        return f"granian x{web_workers} x{threads} threads"
    return f"gunicorn x{web_workers} {worker_class}" + (f" x{threads} threads" if worker_class == "gthread" else "")


def _variant(
    name: str, *, label: str, n: int, connections: int, server: str, web_workers: int, worker_class: str, threads: int,
    client: str,
    instance_ids: list[str], progress: Progress, logs: Path,
) -> dict:
    from controlplane.celery import app as celery_app

    _reset_rows()
    handoff = {"batched": "batched", "batched_nice": "batched", "per_request": "per_request", "insert_only": "none",
               "parse_only": "none"}[name]
    path = "/api/v1/webhooks/bench/parse-only/" if name == "parse_only" else f"/api/v1/webhooks/aws/eventbridge/{TEAM}/"
    port = _free_port()
    env = _env(SPOTPIPE_NOTICE_HANDOFF=handoff, SPOTPIPE_BENCH_ENDPOINTS="1", SPOTPIPE_WEB_THREADS=str(threads))
    web = _start(_server_cmd(port, server=server, web_workers=web_workers, worker_class=worker_class,
                             threads=threads), env, logs / "bench-webhooks-web.log")
    # No beat: other apps' periodic tasks (reconcile, dead-agent detection) are not part of this
    # measurement; `_wait_processed` sends the notice sweep every 5 s as beat would.
    # batched_nice: the same product path, with the Celery worker at a lower CPU priority than the
    # web server (nice 10), for when both share the machine: ingest first, reactions with what is left.
    worker = _start(
        [
            *(["nice", "-n", "10"] if name == "batched_nice" else []),
            str(BIN / "celery"),
            "-A",
            "controlplane",
            "worker",
            "-c",
            "2",
            "-l",
            "WARNING",
            "--prefetch-multiplier",
            "1",
            "-n",
            f"bench-{label}@%h",
        ],
        env,
        logs / "bench-webhooks-worker.log",
    )
    try:
        _wait_ready(port, web)
        _warm_up(port, connections)
        stream, unique = _stream(n, instance_ids, seed=42)
        bodies = [json.dumps(e).encode() for e in stream]
        progress.step(f"{name}: burst of {n} notices ({n - unique} duplicates) over {connections} connections "
                      f"({client} client)")
        web_cpu0, worker_cpu0, client_cpu0 = _session_cpu_s(web.pid), _session_cpu_s(worker.pid), time.process_time()
        load0 = os.getloadavg()[0]
        if client == "wrk":
            burst = _burst_wrk(port, bodies, path, connections, time_cap_s=120, work=logs / "bench-webhooks-wrk")
        else:
            burst = _burst(port, [_request(port, b, path) for b in bodies], connections, time_cap_s=120)
        taken = burst.pop("taken")
        # The time cap may stop the burst early: count only what was sent.
        unique = len({stream[i]["id"] for i in taken})
        web_cpu = _session_cpu_s(web.pid) - web_cpu0
        client_cpu = burst.pop("client_cpu_s", None) or (time.process_time() - client_cpu0)
        after_burst = _counts()
        if name == "insert_only":
            celery_app.send_task("fleet.sweep_notices")  # what beat would send
        took = _wait_processed(after_burst["stored"], 240 if n > 3000 else 90, progress, name)
        counts = _counts()
        worker_cpu = _session_cpu_s(worker.pid) - worker_cpu0
        reaction_p50, reaction_p99 = _reaction_latencies()
        quiet = _quiet_path(port, instance_ids[-20:], 10) if name.startswith("batched") else {}
    finally:
        _stop(web)
        _stop(worker)
    accepted = burst["statuses"].get(202, 0) + burst["statuses"].get(200, 0)
    return {
        "variant": label,
        "client": client,
        "server": _server_label(server, web_workers, worker_class, threads),
        "requests": burst["sent"],
        "unique_notices": unique,
        "duplicates_sent": burst["sent"] - unique,
        **burst,
        "statuses": {str(k): v for k, v in sorted(burst["statuses"].items())},
        "answered_2xx": accepted,
        "stored_after_burst": after_burst["stored"],
        "processed_after_burst": after_burst["processed"],
        **counts,
        # Lost: a unique notice that was sent but not stored. Processing that is merely slow is
        # `unprocessed_at_bound` (the sweep keeps going after the bench stops waiting).
        "lost": 0 if name == "parse_only" else max(0, unique - counts["stored"]),
        "unprocessed_at_bound": counts["stored"] - counts["processed"],
        "duplicates_acted_on": max(0, counts["stored"] - unique)
        + counts["reacted_twice"]
        + max(0, burst["statuses"].get(202, 0) - unique),
        "processing_done_s_after_burst": round(took, 2),
        "end_to_end_processed_per_s": round(counts["processed"] / (burst["elapsed_s"] + took), 1),
        "time_to_all_processed_s": round(burst["elapsed_s"] + took, 2),
        "reaction_p50_s": reaction_p50,
        "reaction_p99_s": reaction_p99,
        **quiet,
        # CPU per request of the web server alone, whatever else the machine runs; its ceiling is what
        # two cores would sustain if they did nothing else.
        "web_cpu_ms_per_request": round(web_cpu / burst["sent"] * 1000, 3),
        "web_ceiling_per_s_on_2_cores": round(2 / (web_cpu / burst["sent"]), 0) if web_cpu else None,
        "worker_cpu_ms_per_notice": round(worker_cpu / max(counts["processed"], 1) * 1000, 3),
        "client_cpu_ms_per_request": round(client_cpu / burst["sent"] * 1000, 3),
        "load_average_before": round(load0, 2),
    }


def run(
    *,
    quick: bool,
    progress: Progress,
    requests: int | None = None,
    connections: int = 8,
    web_workers: int = 3,
    server: str = "granian",
    worker_class: str = "gthread",
    threads: int = 4,
    client: str = "auto",
    variants: str = DEFAULT_VARIANTS,
) -> dict:
    """Run every variant and print one table; returns the figures per variant and the ratios."""
    n = requests or (2000 if quick else 6000)
    if client == "auto":
        client = "wrk" if _wrk_binary() else "python"
        if client == "python":
            print("wrk is not installed (make bench-tools, or apt-get install wrk): the Python client sends the "
                  "load, and its own ceiling bounds every variant's notices/s; parse_only's rate is that ceiling, "
                  "so a variant near it measures the client, not the server")
    logs = ROOT / "var" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    _prepare_database(progress)
    _django()
    instance_ids = _seed(400 if quick else 1200)
    results = {}
    for name in [v.strip() for v in variants.split(",") if v.strip()]:
        base, variant_server = _split_server(name, server)
        results[name] = _variant(
            base,
            label=name,
            n=n,
            connections=connections,
            web_workers=web_workers,
            server=variant_server,
            worker_class=worker_class,
            threads=threads,
            client=client,
            instance_ids=instance_ids,
            progress=progress,
            logs=logs,
        )
    rows = [
        [
            r["variant"],
            r["server"],
            r["requests"],
            r["notices_per_s"],
            r["p50_ms"],
            r["p99_ms"],
            r["stored"],
            r["processed"],
            r["lost"],
            r["duplicates_acted_on"],
            r["end_to_end_processed_per_s"],
            r["reaction_p50_s"],
            r["reaction_p99_s"],
            r["web_cpu_ms_per_request"],
            r["web_ceiling_per_s_on_2_cores"],
            r["worker_cpu_ms_per_notice"],
            r["client_cpu_ms_per_request"],
            r["load_average_before"],
        ]
        for r in results.values()
    ]
    print_table(
        f"webhook ingest, {n} EventBridge notices (20% duplicates), {connections} connections, "
        f"client {client}, {web_workers} web workers x {threads} threads, PostgreSQL, Redis, "
        f"celery -c 2, {os.cpu_count()} cores",
        [
            "variant",
            "server",
            "requests",
            "notices/s",
            "p50 ms",
            "p99 ms",
            "stored",
            "processed",
            "lost",
            "dup acted",
            "e2e processed/s",
            "reaction p50 s",
            "reaction p99 s",
            "web CPU ms/req",
            "web ceiling/s on 2 cores",
            "worker CPU ms/notice",
            "client CPU ms/req",
            "load before",
        ],
        rows,
    )
    figures: dict[str, Any] = {"variants": results}
    for product in ("batched", "batched_nice"):
        if product not in results:
            continue
        b = results[product]
        figures.setdefault("target", {})[product] = {
            "notices_per_s_at_least": TARGET_RATE,
            "p99_ms_under": TARGET_P99_MS,
            "met": bool(
                b["notices_per_s"] >= TARGET_RATE
                and b["p99_ms"] < TARGET_P99_MS
                and b["lost"] == 0
                and b["duplicates_acted_on"] == 0
            ),
        }
        ratios = figures.setdefault("ratios", {})
        if "per_request" in results:
            p = results["per_request"]
            ratios[f"{product}_vs_per_request_notices_per_s"] = round(b["notices_per_s"] / p["notices_per_s"], 2)
            ratios[f"{product}_vs_per_request_p99"] = round(b["p99_ms"] / p["p99_ms"], 2)
            ratios[f"{product}_vs_per_request_e2e_processed_per_s"] = round(
                b["end_to_end_processed_per_s"] / max(p["end_to_end_processed_per_s"], 1e-9), 2
            )
        if f"{product}_gunicorn" in results and server == "granian":
            g = results[f"{product}_gunicorn"]
            ratios[f"{product}_vs_{product}_gunicorn_notices_per_s"] = round(b["notices_per_s"] / g["notices_per_s"], 2)
            ratios[f"{product}_vs_{product}_gunicorn_web_cpu_per_request"] = round(
                b["web_cpu_ms_per_request"] / g["web_cpu_ms_per_request"], 2
            )
        for base in ("insert_only", "parse_only"):
            if base in results:
                ratios[f"{product}_vs_{base}_notices_per_s"] = round(
                    b["notices_per_s"] / results[base]["notices_per_s"], 2
                )
                ratios[f"{product}_vs_{base}_web_cpu_per_request"] = round(
                    b["web_cpu_ms_per_request"] / results[base]["web_cpu_ms_per_request"], 2
                )
        if b.get("quiet_reaction_p50_ms") is not None:
            print(
                f"\nquiet path ({product}): store-to-reaction p50 {b['quiet_reaction_p50_ms']} ms, "
                f"max {b['quiet_reaction_max_ms']} ms over {b['quiet_reacted']}/{b['quiet_notices']} notices"
            )
        print(
            f"target ({TARGET_RATE:.0f}/s, p99 < {TARGET_P99_MS:.0f} ms, none lost, duplicates once) for {product}: "
            f"{'met' if figures['target'][product]['met'] else 'NOT met'}"
        )
    if figures.get("ratios"):
        print(f"ratios: {figures['ratios']}")
    return figures
