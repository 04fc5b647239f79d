"""A local launcher for tests and benchmarks: it plays the node agent and the control plane.

It hosts the job's TCPStore, starts one real process per node (forkserver with the runtime
preloaded, so a worker is up in milliseconds rather than seconds of `import torch`), marks exited
processes dead in the store (as an agent would), injects failures (SIGKILL, SIGSTOP, notices, at a
step or at a time, or from a trace file), starts replacements, and returns the final parameters.
Every process it started is killed when it returns, whatever happens (no orphans; workers also
die with their parent via PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runtime.config import JobConfig
from runtime.distributed.coordinator import Coordinator, serve
from runtime.strategies import initial_layout
from runtime.train.metrics_log import read_records

FAULT_KINDS = ("kill", "stop", "notice", "delay")
FAULT_PHASES = ("step", "transfer", "validation")


@dataclass(kw_only=True, slots=True)
class Fault:
    """A failure to inject into `node`."""

    node: int
    """Victim node id."""
    kind: str
    """`kill` (SIGKILL), `stop` (SIGSTOP: a hung node), `notice` (graceful leave) or `delay` (the
    worker sleeps `delay_s` at that point: a slow link or a slow step; with `step` or `phase` only)."""
    step: int | None = None
    """Inject inside this step (the worker does it itself at action `at`; -1 = mid-step)."""
    at: int = -1
    """Action index within the step (with `step`), or message index within a hand-over (`phase`)."""
    time_s: float | None = None
    """Or: inject from outside this many seconds after training started (the first committed step)."""
    phase: str = "step"
    """`step`: inside a training step. `transfer`: inside a state hand-over at a generation change
    (the first one starting at `step` or later, any if `step` is None), before the node's transfer
    message `at` (-1: the middle one; their number: after the last); a node not in the hand-over
    fires once the nodes in it have met (see `FaultInjector.at_transfer`). `validation`: inside
    the validation pass on the parameters after `step` steps, before its action `at`."""
    delay_s: float = 0.0
    """`delay`: how long the worker sleeps."""


@dataclass(kw_only=True, slots=True)
class Join:
    """Start a replacement worker."""

    node: int
    """Its (new) node id."""
    after_step: int | None = None
    """Start it once any node has committed this step."""
    time_s: float | None = None
    """Or: this many seconds after training started (the first committed step)."""


@dataclass(kw_only=True, slots=True)
class RunResult:
    """What a local run produced."""

    params: dict[str, torch.Tensor]
    """Final parameters by name (`layer{i}.{param}`), from the nodes that finished."""
    replicas: dict[str, list[torch.Tensor]]
    """Every finished node's copy of every parameter (to check replicas agree)."""
    records: list[dict[str, Any]]
    """All metrics and events of all nodes, sorted by time."""
    exit_codes: dict[int, int | None]
    """Per node: 0 = clean, negative = killed by that signal."""
    started: float
    """Wall-clock time the job was started."""
    wall_s: float
    """Seconds from start to the last worker's exit."""
    injected: list[dict[str, Any]] = field(default_factory=list)
    """External injections the launcher made (kind, node, time)."""
    pids: dict[int, int] = field(default_factory=dict)
    """Per node: its process id (all of them are killed and reaped when `run_local` returns)."""

    def steps(self) -> list[dict[str, Any]]:
        """Per-step metrics records."""
        return [r for r in self.records if "step" in r and "event" not in r]


def faults_from_trace(
    path: str | Path, *, nodes: int, time_scale: float, limit: int | None = None, trace_format: str | None = None
) -> tuple[list[Fault], list[Join]]:
    """Turn a preemption trace (any format `runtime.traces.load_trace` reads) into timed kills
    and joins (`trace_format`: its `runtime.traces.FORMATS` name, when the file does not name it).

    The first `nodes` names the trace adds are our nodes 0..nodes-1 (the job starts with them); a
    later `remove` of one of ours is a SIGKILL, a later `add` is a replacement with a new id.
    Trace time starts at the first removal of one of ours and is multiplied by `time_scale` (e.g. 1e-3).
    """
    from runtime.traces import ADD, REMOVE, load_trace

    names: dict[str, int] = {}
    faults: list[Fault] = []
    joins: list[Join] = []
    origin = None
    next_id = nodes
    for event in load_trace(path, format=trace_format).events:
        t, op, name = event.t_s, event.kind, event.node
        if op == ADD and len(names) < nodes and origin is None:
            names[name] = len(names)
            continue
        if origin is None and op == REMOVE and name in names:
            origin = t
        if origin is None:
            continue
        at = (t - origin) * time_scale
        if op == REMOVE and name in names:
            faults.append(Fault(node=names.pop(name), kind="kill", time_s=at))
        elif op == ADD and faults:
            names[name] = next_id
            joins.append(Join(node=next_id, time_s=at))
            next_id += 1
        if limit is not None and len(faults) >= limit:
            break
    return faults, joins


def _child(spec: dict[str, Any], environ: dict[str, str]) -> None:
    from runtime.train.trainer import WorkerSpec, _die_with_parent, run_worker

    # The forkserver kept the environment of the run that started it: a rank takes the launcher's
    # now (the data cache, S3 endpoint and credentials of this run), as a process it spawned would.
    os.environ.clear()
    os.environ.update(environ)

    # A terminal's Ctrl-C reaches the whole process group: the launcher answers it (it ends every
    # rank it started), so a rank neither stops half-way on its own nor prints a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    run_worker(WorkerSpec(**spec))


def _context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["runtime.train.trainer"])
    return ctx


def run_local(
    config: JobConfig,
    *,
    faults: Sequence[Fault] = (),
    joins: Sequence[Join] = (),
    timeout_s: float = 120.0,
    out_dir: str | Path | None = None,
    export_dir: str | Path | None = None,
    stop_after_step: int | None = None,
) -> RunResult:
    """Run `config` on dp*pp local processes over gloo with the given faults; returns final state.

    Validates the layout before anything starts (an impossible layout raises `LayoutError`).
    With `export_dir`, the workers write the job's final weights there (`runtime.checkpointing.export`).
    With `stop_after_step`, the job is asked to stop (`Coordinator.request_stop`, what a limit of the
    control plane does) once a node has committed that step: its members checkpoint one step and exit.
    """
    initial_layout(config)  # raises before any process starts
    _check_faults(faults)
    tmp = tempfile.TemporaryDirectory(prefix="spotpipe-") if out_dir is None else None
    out = Path(out_dir or tmp.name)  # type: ignore[union-attr]
    out.mkdir(parents=True, exist_ok=True)
    run = _LocalJob(config, faults, out, export_dir)
    started = time.time()
    try:
        for node in range(config.num_nodes):
            run.start(node, joining=False)
        run.supervise(list(joins), timeout_s=timeout_s, stop_after_step=stop_after_step)
        wall = time.time() - started
        return _collect(out, run.procs, started, wall, run.injected)
    finally:
        run.kill_all()
        if tmp is not None:
            tmp.cleanup()


def _check_faults(faults: Sequence[Fault]) -> None:
    for fault in faults:
        if fault.phase not in FAULT_PHASES:
            raise ValueError(f"fault phase {fault.phase!r} is unknown; expected one of {FAULT_PHASES}")
        # A worker ignores a kind it does not know, so a typo would silently inject nothing.
        if fault.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {fault.kind!r} is unknown; expected one of {FAULT_KINDS}")
        if fault.kind == "delay" and (fault.time_s is not None or not fault.delay_s > 0):
            raise ValueError(
                f"a delay fault needs delay_s > 0 (got {fault.delay_s}) and a step or phase='transfer', "
                f"not time_s={fault.time_s}: the worker sleeps itself"
            )


class _LocalJob:
    """The processes of one `run_local` job, its rendezvous store, and what the launcher does to them
    as an agent and a cloud would: start, inject timed faults, start joiners, mark the dead."""

    def __init__(self, config: JobConfig, faults: Sequence[Fault], out: Path, export_dir: str | Path | None) -> None:
        self.config, self.faults, self.out, self.export_dir = config, faults, out, export_dir
        self.ctx = _context()
        self.store = serve(0)
        self.job = f"job-{uuid.uuid4().hex[:8]}"
        self.coord = Coordinator(self.store, self.job)
        self.address = f"127.0.0.1:{self.store.port}"
        self.procs: dict[int, mp.process.BaseProcess] = {}
        self.stopped: set[int] = set()
        self.reported: set[int] = set()
        self.injected: list[dict[str, Any]] = []

    def start(self, node: int, *, joining: bool) -> None:
        own = [
            {"kind": f.kind, "step": f.step, "at": f.at, "phase": f.phase, "delay_s": f.delay_s}
            for f in self.faults
            if f.node == node and (f.step is not None or f.phase == "transfer")
        ]
        spec = {
            "job_id": self.job,
            "node": node,
            "rendezvous": self.address,
            "config": self.config.to_dict(),
            "joining": joining,
            "out_dir": str(self.out),
            "export_dir": str(self.export_dir or ""),
            "device_index": node,  # the nodes share this host's GPUs (resolve_device wraps it)
            "faults": own,
        }
        proc = self.ctx.Process(target=_child, args=(spec, dict(os.environ)), name=f"spotpipe-node-{node}",
                                daemon=True)
        proc.start()
        self.procs[node] = proc

    def supervise(self, pending_joins: list[Join], *, timeout_s: float, stop_after_step: int | None) -> None:
        """Until every worker has exited or is stopped and no join is pending: timed faults, joins
        and the job's stop at their time, a dead mark for each worker that failed."""
        out, procs = self.out, self.procs
        timed = sorted((f for f in self.faults if f.time_s is not None), key=lambda f: f.time_s or 0.0)
        joins_timed = any(j.time_s is not None for j in pending_joins)
        may_stop = any(f.kind == "stop" for f in self.faults)  # only a fault stops a worker (SIGSTOP)
        deadline = time.monotonic() + timeout_s
        training_since: float | None = None  # process start-up is not part of a trace's clock
        while True:
            if training_since is None and (timed or joins_timed) and _max_committed(out) >= 1:
                training_since = time.time()
            now = time.time() - training_since if training_since is not None else -1.0
            for node, proc in procs.items():
                if proc.exitcode is not None and node not in self.reported:
                    self.reported.add(node)
                    if proc.exitcode != 0:
                        self.coord.mark_dead(node)  # what the node agent does when its worker dies
            while timed and training_since is not None and now >= (timed[0].time_s or 0.0):
                fault = timed.pop(0)
                _inject(fault, procs, self.coord, self.stopped)
                self.injected.append({"kind": fault.kind, "node": fault.node, "time": time.time()})
            if stop_after_step is not None and _max_committed(out) >= stop_after_step:
                self.coord.request_stop()
                self.injected.append({"kind": "stop_job", "node": None, "time": time.time()})
                stop_after_step = None
            for join in list(pending_joins):
                due = join.time_s is not None and now >= join.time_s and training_since is not None
                if join.after_step is not None and not due:
                    due = _max_committed(out) >= join.after_step
                if due:
                    pending_joins.remove(join)
                    self.injected.append({"kind": "join", "node": join.node, "time": time.time()})
                    self.start(join.node, joining=True)
            running = [
                n for n, p in procs.items()
                if p.exitcode is None and n not in self.stopped and not (may_stop and _is_stopped(p.pid))
            ]
            if not running and not pending_joins:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"job did not finish within {timeout_s}s; still running: {running}")
            # Sleep until a worker exits (seen at once: the agent's dead mark is on the recovery
            # path) or the next poll for timed faults, joins and stopped workers is due. A fixed 5 ms
            # sleep with /proc reads cost this process ~8% of a core: on a 2-core machine, taken
            # from the workers (bench training).
            mp.connection.wait([procs[n].sentinel for n in running],
                               timeout=0.005 if timed or pending_joins else 0.05)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]  # stopped ones too
        for proc in self.procs.values():
            proc.join(timeout=5)


def _is_stopped(pid: int | None) -> bool:
    """True if the process is stopped (SIGSTOP: a hung node, which will never finish by itself)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


def _inject(fault: Fault, procs: dict[int, Any], coord: Coordinator, stopped: set[int]) -> None:
    proc = procs.get(fault.node)
    if proc is None or proc.exitcode is not None:
        return
    if fault.kind == "kill":
        os.kill(proc.pid, signal.SIGKILL)
    elif fault.kind == "stop":
        os.kill(proc.pid, signal.SIGSTOP)
        stopped.add(fault.node)
    elif fault.kind == "notice":
        coord.notify(fault.node)
    else:
        raise ValueError(f"fault kind {fault.kind!r} is unknown; expected kill, stop or notice")


def _max_committed(out: Path) -> int:
    best = -1
    for path in out.glob("metrics-*.jsonl"):
        for record in read_records(path):
            if "step_time_s" in record:
                best = max(best, record["step"] + 1)
    return best


def _collect(out: Path, procs: dict[int, Any], started: float, wall: float, injected: list) -> RunResult:
    records: list[dict[str, Any]] = []
    for path in out.glob("metrics-*.jsonl"):
        records += read_records(path)
    records.sort(key=lambda r: r["time"])
    params: dict[str, torch.Tensor] = {}
    replicas: dict[str, list[torch.Tensor]] = {}
    for path in sorted(out.glob("node-*.pt")):
        saved = torch.load(path, weights_only=True)
        for name, tensor in saved["params"].items():
            params.setdefault(name, tensor)
            replicas.setdefault(name, []).append(tensor)
    codes = {node: proc.exitcode for node, proc in procs.items()}
    return RunResult(
        params=params,
        replicas=replicas,
        records=records,
        exit_codes=codes,
        started=started,
        wall_s=wall,
        injected=injected,
        pids={node: proc.pid for node, proc in procs.items()},
    )
