"""`spotpipe demo`: the whole product on one machine.

Migrate, seed the market and a demo team, start the web server, a Celery worker and beat, submit a
small GPT job on the local provider, drive preemptions from a trace (with and without notices,
compressed onto the job's progress), show the job as it goes, then print its cost report and the
simulator's comparison with checkpoint-restart on the same trace. Interactive: keep the dashboard
serving until Ctrl-C. `--headless`: exit 0 when the job finished with its loss below the initial
loss, 1 otherwise. Whatever happens, every process the demo started (and theirs) is ended on exit.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connection

from controlplane.billing.reports import job_cost_report
from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.jobs.artifacts import job_artifacts_location
from controlplane.jobs.models import JobStatus
from controlplane.orchestration import tasks
from controlplane.orchestration.providers.local.provider import LocalProvider
from controlplane.orchestration.rendezvous import rendezvous_release
from runtime.config import resolve_strategy
from spotpipe.demo import preemption_script, processes, report, seed
from spotpipe.demo.driver import Console, Driver, layout_for, steps_for, submit_job
from spotpipe.demo.learning import learning_lines, learning_summary
from spotpipe.demo.market import STAND_IN_TYPE
from spotpipe.demo.preemption_script import describe

SUMMARY_NAME = "demo-summary.json"


@dataclass(frozen=True, slots=True)
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    strategy: str = "recycle"
    nodes: int = 4
    trace: Path | None = None
    trace_format: str | None = None
    """`runtime.traces.FORMATS` name of `trace` (None: named in the file or by its syntax)."""
    prices: Path | None = None
    duration: float = 150.0
    seed: int = 0
    headless: bool = False
    worker_concurrency: int = 3
    screenshot: Path | None = None
    external: str = ""
    """URL of a control plane already running (docker compose): start no web server, worker or beat;
    the nodes are started by that stack's worker, which must share this process's host."""


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _wait_http(url: str, *, timeout_s: float, stack: processes.Stack) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack.exited():
            raise RuntimeError(f"{', '.join(stack.exited())} exited at start-up; see {stack.log_dir}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status < 500:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the web server did not answer {url} within {timeout_s:.0f} s; see {stack.log_dir}/web.log")


def _cleanup(*, stack: processes.Stack, provider: LocalProvider, job: Any, var_dir: Path,
             own_nodes_dir: bool) -> list[int]:
    """Stop the stack, then whatever it left: the job's nodes, its rendezvous store, and any process
    still marked with our var dir. Returns the pids the final sweep had to end."""
    stack.stop()
    if own_nodes_dir:
        provider.terminate(provider.all_node_ids())
    elif job is not None:
        # A shared nodes directory (another stack's worker started them): only this job's nodes.
        provider.terminate([i for i in Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True)
                            if i])
    if job is not None:
        try:
            rendezvous_release(job=job)
        except Exception as exc:  # the database may be the thing that failed
            print(f"could not release the rendezvous store: {exc}", file=sys.stderr)
    # With --external the marked processes are the stack's, not ours: leave them.
    return processes.sweep(var_dir) if own_nodes_dir else []


def take_screenshot(*, base: str, job_id: int, username: str, password: str, path: Path) -> None:
    """Log in with the system's headless Chromium and capture the job's dashboard page."""
    from playwright.sync_api import sync_playwright

    from frontend import browser

    path.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        try:
            page = chromium.new_page(viewport={"width": 1280, "height": 760})
            browser.login(page, base, username, password)
            page.goto(f"{base}/jobs/{job_id}/")
            browser.wait_loaded(page)
            page.wait_for_timeout(1000)  # let the charts finish drawing
            page.screenshot(path=str(path))  # the first screenful: progress, loss, throughput, cost
        finally:
            chromium.close()


def planner_advice(job: Any) -> dict[str, Any]:
    """What the planner would choose for this job on the market's cloud pools (the demo's own types),
    with a one-hour deadline: the plan a cloud run of the job would get."""
    from django.utils import timezone

    from controlplane.jobs.selectors import plan_input_from_job
    from controlplane.planning.services import plan_compute
    from spotpipe.demo.market import DEMO_TYPES

    data = plan_input_from_job(job=job, instance_types=[t for t, _ in DEMO_TYPES], at=timezone.now(),
                               deadline_hours=1.0)
    plan, _pools = plan_compute(data=data, team_ids=[job.team_id])
    return plan.best.to_dict()


def _counts(job: Any, driver: Driver) -> dict[str, Any]:
    instances = Instance.objects.filter(job=job)
    reconfigurations = driver.reconfigurations()
    return {
        "instances": instances.count(),
        "preempted_instances": instances.filter(state="preempted").count(),
        "instances_with_notice": instances.filter(notice_at__isnull=False).count(),
        "notices": InterruptionNotice.objects.filter(instance__job=job).count(),
        "reconfigurations": [
            {"trigger": r.trigger, "decision": r.decision, "status": r.status, "from": r.from_generation,
             "to": r.to_generation, "instance": r.instance_id} for r in reconfigurations
        ],
        "generations": job.current_generation,
    }


def run_demo(options: DemoOptions) -> int:
    """Run the demo; returns the process exit status."""
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGHUP, _raise_keyboard_interrupt)
    started = time.monotonic()
    console = Console(started=started)
    var_dir = Path(settings.VAR_DIR).resolve()
    run_stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    nodes_dir = var_dir / "nodes" / run_stamp
    host = "127.0.0.1" if options.host in ("0.0.0.0", "") else options.host
    base = options.external.rstrip("/") or f"http://{host}:{options.port}"
    dp, pp = layout_for(options.nodes)
    if not options.external and not _port_free(options.host, options.port):
        print(f"port {options.port} on {options.host} is in use; pass --port", file=sys.stderr)
        return 2

    console.line(f"database: {connection.vendor} ({settings.DATABASES['default'].get('NAME')}); broker: "
                 f"{settings.CELERY_BROKER_URL.split('@')[-1]}; var dir: {var_dir}")
    call_command("migrate", interactive=False, verbosity=0)
    console.line("migrated")
    market = seed.seed_market(seed=options.seed, prices=options.prices)
    console.line(f"market: {market.source}: {market.rows} price changes read, {market.inserted} new, "
                 f"{market.pools} pools; local nodes are priced as {market.stand_in} "
                 f"(${market.stand_in_price}/h spot, ${market.on_demand_price}/h on demand)")
    team = seed.seed_team()
    trace = preemption_script.demo_trace(nodes=options.nodes, seed=options.seed, path=options.trace,
                                         trace_format=options.trace_format)
    max_events = max(2, min(6, int(options.duration // 45)))
    plan = preemption_script.demo_schedule(trace, seed=options.seed, dp=dp, pp=pp, max_events=max_events)

    env = {
        "SPOTPIPE_PUBLIC_URL": base,
        "SPOTPIPE_RENDEZVOUS": "process",
        "SPOTPIPE_LOCAL_NODES_DIR": str(nodes_dir),
        "SPOTPIPE_HEARTBEAT_TIMEOUT_S": "2.0",
    }
    stack = processes.Stack(var_dir=var_dir, env=env)
    if options.external:
        # The stack's worker starts the nodes where its local provider is configured to.
        from controlplane.orchestration.providers import get_provider

        provider = get_provider("local")
        nodes_dir = provider.root
    else:
        provider = LocalProvider(nodes_dir)
    job = None
    summary: dict[str, Any] = {"options": {k: str(v) if isinstance(v, Path) else v
                                           for k, v in dataclasses.asdict(options).items()}}
    status = 1
    try:
        if options.external:
            _wait_http(f"{base}/accounts/login/", timeout_s=90, stack=stack)
            console.line(f"using the control plane at {base} (its worker starts the nodes in {nodes_dir})")
        else:
            stack.start_web(host=options.host, port=options.port)
            stack.start_worker(concurrency=options.worker_concurrency)
            stack.start_beat()
            _wait_http(f"{base}/accounts/login/", timeout_s=90, stack=stack)
            console.line(f"web server, Celery worker and beat are up (logs in {stack.log_dir})")
        print(f"""
  Dashboard   {base}/   user {team.username!r}, password {team.password!r}
  API         {base}/api/v1/docs/   token: {team.token}
  Admin       {base}/admin/
""", flush=True)

        steps = steps_for(options.duration)
        job = submit_job(team=team.team, user=team.user, strategy=options.strategy,
                         nodes=options.nodes, steps=steps, seed=options.seed, checkpoint_dir=var_dir / "checkpoints")
        tasks.acquire_capacity.delay(job.pk)
        model = job.config["model"]
        console.line(f"job {job.pk}: a byte-level GPT ({model['n_layer']} blocks, width {model['n_embd']}) learning "
                     f"{job.config['data']['source']} "
                     f"for {steps} steps on {options.nodes} local nodes as dp={dp} x pp={pp}, strategy "
                     f"{options.strategy}: {base}/jobs/{job.pk}/")
        try:
            advice = planner_advice(job)
            summary["planner"] = advice
            console.line(
                f"planner: on the market's cloud pools with a 1-hour deadline this job would get {advice['nodes']} x "
                f"{advice['instance_type']} in {advice['zone']} (dp={advice['dp']} x pp={advice['pp']}, "
                f"${advice['cost_usd']:.6f}, {advice['samples_per_s']:.0f} samples/s predicted); the demo spreads it "
                f"over {options.nodes} local nodes instead, to show preemptions")
        except Exception as exc:  # advice only: the demo goes on without it
            console.line(f"planner: no advice ({type(exc).__name__}: {exc})")
        console.line(f"trace: {trace.name} ({len(plan)} preemption event(s) kept, compressed onto "
                     f"{preemption_script.WINDOW[0]:.0%}-{preemption_script.WINDOW[1]:.0%} of the job's steps):")
        for p in plan:
            console.line(f"   event {p.index + 1}: trace t={describe(p.trace_t_s)}, {p.count} node(s), "
                         f"{'with notice' if p.with_notice else 'no notice'}, at step "
                         f"{int(p.at_fraction * steps)}")

        def watch_stack() -> None:
            gone = stack.exited()
            if gone:
                raise RuntimeError(f"{', '.join(gone)} exited; see {stack.log_dir}")

        driver = Driver(job=job, schedule=plan, provider=provider, console=console, dp=dp, pp=pp)
        job = driver.run(timeout_s=max(240.0, options.duration * 4), on_tick=watch_stack)
        console.line(f"job {job.pk} {job.status} after {job.steps_done} steps: loss {job.initial_loss} -> "
                     f"{job.last_loss}, validation loss {job.last_val_loss}")
        learned = learning_summary(job.config, val_loss=job.last_val_loss,
                                   weights=job_artifacts_location(job=job))
        print()
        print("\n".join(learning_lines(learned)), flush=True)

        if options.screenshot is not None:
            try:
                take_screenshot(base=base, job_id=job.pk, username=team.username, password=team.password,
                                path=options.screenshot)
                console.line(f"screenshot of the job's page: {options.screenshot}")
            except Exception as exc:  # a missing browser must not fail the demo
                console.line(f"no screenshot: {type(exc).__name__}: {exc}")
        cost = job_cost_report(job=job)
        print()
        print("\n".join(report.cost_lines(cost)), flush=True)
        segment_sum = sum((s.cost for s in cost.segments), 0)
        comparisons = report.simulate_comparison(
            trace, strategy=resolve_strategy(options.strategy), dp=dp, pp=pp, instance_type=STAND_IN_TYPE,
            spot_usd_per_hour=float(market.stand_in_price) or 0.16,
            on_demand_usd_per_hour=float(market.on_demand_price) or 0.526)
        print()
        print("\n".join(report.comparison_lines(comparisons, trace=trace, dp=dp, pp=pp,
                                                instance_type=STAND_IN_TYPE)), flush=True)
        ok = job.status == JobStatus.FINISHED and job.initial_loss is not None and job.last_loss is not None \
            and job.last_loss < job.initial_loss and learned["learned"]
        summary.update({
            "job": job.pk, "status": job.status, "steps_done": job.steps_done, "target_steps": job.target_steps,
            "initial_loss": job.initial_loss, "final_loss": job.last_loss, "dashboard": f"{base}/jobs/{job.pk}/",
            "learning": learned,
            "fired": [{"event": f.preemption.index + 1, "with_notice": f.preemption.with_notice,
                       "trace_t_s": f.preemption.trace_t_s, "at_step": f.at_step, "instances": f.instances,
                       "skipped": f.skipped} for f in driver.fired],
            "joined": driver.joined,
            **_counts(job, driver),
            "cost": {"total_usd": str(cost.total), "segments_sum_usd": str(segment_sum),
                     "segments": len(cost.segments), "on_demand_equivalent_usd": str(cost.on_demand_equivalent)},
            "simulator": [{"strategy": c.strategy, **c.summary} for c in comparisons],
            "seconds": round(time.monotonic() - started, 1),
        })
        status = 0 if ok else 1
        console.line(f"demo {'succeeded' if ok else 'FAILED'} in {describe(time.monotonic() - started)}")
        if not options.headless:
            print(f"\nThe dashboard keeps serving at {base}/jobs/{job.pk}/  (Ctrl-C to stop)", flush=True)
            while not stack.exited():
                time.sleep(0.5)
            if stack.procs:
                print(f"{', '.join(stack.exited())} exited; see {stack.log_dir}", file=sys.stderr)
            while options.external:  # the stack serves; wait for Ctrl-C
                time.sleep(0.5)
    except KeyboardInterrupt:
        console.end_progress()
        console.line("stopping")
    except Exception as exc:
        console.end_progress()
        console.line(f"demo failed: {type(exc).__name__}: {exc}")
        summary["error"] = f"{type(exc).__name__}: {exc}"
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        swept = _cleanup(stack=stack, provider=provider, job=job, var_dir=var_dir,
                         own_nodes_dir=not options.external)
        summary["swept_pids"] = swept
        summary["exit_status"] = status
        (var_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=str))
        console.line(f"everything stopped{f' (ended {len(swept)} stray process(es))' if swept else ''}; "
                     f"summary in {var_dir / SUMMARY_NAME}")
    return status

