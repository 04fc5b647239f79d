"""The worker process the agent starts: an adapter from the agent's worker protocol (see
`agent/supervisor.py`) to the runtime's worker (`runtime.train.trainer`).

    python -m agent.worker_entry --spec SPEC --control CONTROL

It builds the runtime's `WorkerSpec` from the job's stored contract (the runtime's JobConfig, passed
unchanged) and this node's assignment, prints each committed
step as a `SPOTPIPE {"type": "metrics", ...}` line, and watches two files at a short interval:
CONTROL (the newest generation: if this node is no longer a member, it asks the runtime to leave
at its next step boundary) and `notice` in the work directory (the agent saw an interruption
notice in the metadata endpoint: leave at once, before the control plane has even answered), and
`stop-<job>` (a limit stops the job: the runtime's members agree on a step, checkpoint it and exit).
The runtime itself forms its generations through the job's rendezvous store. When the runtime
finds the job cannot go on, the worker prints `{"type": "failed", "reason": ...}` and exits with
EXIT_JOB_FAILED. A worker started again for the same node (the agent restarts a crashed one) joins
the running job as a replacement under a new runtime node id (`runtime_node`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

from agent.command import CommandGeneration, CommandJob
from runtime.distributed.published_layout import PublishedLayout
from runtime.worker_exits import EXIT_FENCED, EXIT_JOB_FAILED

WATCH_INTERVAL_S = 0.02
# Runtime node id of incarnation k of control-plane node n: n + k * INCARNATION_STRIDE. Incarnation 0
# (a node's first worker) keeps n, so nothing changes for a job without restarts; control-plane node
# ids stay far below the stride (one per instance a job ever had).
INCARNATION_STRIDE = 1_000_000


def runtime_node(node: int, incarnation: int) -> int:
    """The runtime's node id for incarnation `incarnation` (0 = first start) of control-plane node `node`.

    Why a new id rather than reusing `node` for a restarted worker: in the job's store a node id
    dies once. `dead/<id>` (and `left/<id>`, `joined/<id>`, `notice/<id>`) are never cleared,
    because survivors may still be reading them for the crashed process -- e.g. at a rendezvous
    that expects it -- and clearing them would make that process look alive again (a fresh
    heartbeat under the same id: the survivors would wait for it until their rendezvous timeout)
    or let a member with a new process and no state answer as the old one. A new id keeps every
    key's meaning: the old incarnation stays dead, the new one is a replacement like any other."""
    if not 0 <= node < INCARNATION_STRIDE or incarnation < 0:
        # Past the stride, incarnation 1 of one node would take another node's id.
        raise ValueError(
            f"node id {node} / incarnation {incarnation}: "
            f"expected 0 <= node < {INCARNATION_STRIDE:,} and incarnation >= 0"
        )
    return node + incarnation * INCARNATION_STRIDE


def metrics_message(record: dict[str, Any], *, generation: int) -> dict[str, Any]:
    """The agent's `metrics` message for one of the runtime's step records: a training step
    (`loss`, `samples_per_s`, `stage_times_s`) or a validation pass (`val_loss`, no `loss`). `step`
    becomes the number of completed steps (the runtime's is the index of the last one), so a
    validation pass after step index s lands on the same step as that step's training record."""
    message: dict[str, Any] = {
        "type": "metrics", "step": int(record["step"]) + 1, "loss": record.get("loss"),
        "samples_per_s": record.get("samples_per_s"), "stage_times": record.get("stage_times_s") or {},
        "generation": generation, "runtime_generation": record.get("generation"),
    }
    if record.get("val_loss") is not None:
        message["val_loss"] = record["val_loss"]
    return message


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write("SPOTPIPE " + json.dumps(message) + "\n")
    sys.stdout.flush()


class _Watcher(threading.Thread):
    """Turns the agent's files into runtime notices for this node, and tells the runtime about
    members the control plane dropped before their worker ever started."""

    def __init__(self, control: Path, notice: Path, node: int, coordinator: Any, *,
                 runtime_node: int | None = None, stop: Path | None = None) -> None:
        super().__init__(name="control-watch", daemon=True)
        self.control = control
        self.notice = notice
        self.stop = stop
        """The agent's file asking the job to checkpoint and stop (a limit: `WorkerSupervisor.request_stop`)."""
        self.stop_told = False
        self.node = node
        """The control plane's node id (membership lists use it)."""
        self.runtime_node = node if runtime_node is None else runtime_node
        """This worker's id in the runtime (differs from `node` after a restart: `runtime_node()`)."""
        self.coordinator = coordinator
        self.done = threading.Event()
        self.notified = False

    def _leave(self, why: str) -> None:
        if not self.notified:
            self.notified = True
            self.coordinator.notify(self.runtime_node)
            emit({"type": "leaving", "reason": why})

    def _forget_unstarted(self, dropped: set[int]) -> None:
        """A member the control plane dropped whose worker never started (no heartbeat ever: e.g.
        declared dead while its node was still starting) would be waited for at the rendezvous,
        since the runtime counts a member as gone only once its heartbeats stop. It has no state
        to hand over, so mark it dead and let the survivors go on without it. A dropped member
        that did start leaves by itself (its own agent's watcher gives it the notice)."""
        for node in sorted(dropped - {self.node}):
            if not self.coordinator.store.check([f"hb/{node}"]):
                self.coordinator.mark_dead(node)
                emit({"type": "forgot", "node": node})

    def run(self) -> None:
        seen = None
        members: set[int] | None = None
        while not self.done.wait(WATCH_INTERVAL_S):
            try:
                if self.notice.exists():
                    self._leave("notice")
                if self.stop is not None and not self.stop_told and self.stop.exists():
                    self.stop_told = True
                    self.coordinator.request_stop()
                    emit({"type": "stopping"})
                text = self.control.read_text()
                if text != seen:
                    seen = text
                    generation = CommandGeneration.from_dict(json.loads(text))
                    previous, members = members, {m.get("node") for m in generation.membership}
                    if previous is not None:
                        self._forget_unstarted(previous - members)
                    if self.node not in members:
                        self._leave(f"not a member of generation {generation.number}")
            except (OSError, ValueError):
                continue
            except Exception:  # the store went away: the worker's own calls will fail and it exits
                return


def build_worker_spec(spec: dict[str, Any], *, node: int, joining: bool, out_dir: Path) -> Any:
    """The runtime's `WorkerSpec` for the agent's SPEC (see `agent/supervisor.py`) as runtime node
    `node` (`runtime_node()`: differs from the assignment's node after a restart)."""
    from runtime.train.trainer import WorkerSpec

    job = CommandJob.from_dict(spec["job"])
    layout = PublishedLayout.from_dict(CommandGeneration.from_dict(spec["generation"]).layout)
    # The job's stored contract is the runtime's JobConfig: handed over unchanged.
    return WorkerSpec(
        job_id=f"job{job.id}", node=node, rendezvous=layout.rendezvous, config=job.config,
        generation=0, joining=joining, out_dir=str(out_dir),
        # The job's folder in the control plane's artifact store: the final weights go there.
        export_dir=job.artifacts,
        # The agent's --gpu-index: the GPU of this VM a `cuda` job uses (a spec without it: the first).
        device_index=int(spec.get("device_index", 0)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    # The command's parts the agent wrote (`supervisor._start`), read as the agent read them.
    job, generation = CommandJob.from_dict(spec["job"]), CommandGeneration.from_dict(spec["generation"])
    assignment = spec["assignment"]
    layout = PublishedLayout.from_dict(generation.layout)
    work_dir = Path(spec["work_dir"])
    out_dir = work_dir / "out"
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch.distributed as dist

    from runtime.distributed.coordinator import Coordinator, connect
    from runtime.train.trainer import Fenced, JobCannotContinue, Worker

    node = int(assignment["node"])
    initial_nodes = layout.initial_nodes
    job_id = f"job{job.id}"
    store = connect(layout.rendezvous, timeout_s=60)
    coordinator = Coordinator(store, job_id)
    # Which start of this node's worker this is, counted in the job's store (atomic, and it survives
    # an agent restart). The agent starts a worker again after a crash (exit code other than 0/3/4)
    # or when the control plane gives a node that had left a `run` again. The survivors have formed
    # a generation without the old process by then, so coming back as an original member would be
    # fenced (exit 3): a later start joins as a replacement (the runtime's join path: an empty slot,
    # layers fetched from their holders, or a spare) under a new incarnation id.
    incarnation = coordinator.store.add(f"starts/{node}", 1) - 1
    if incarnation > 0:
        # The agent starts a worker only once the previous one exited: say so at once, so survivors
        # still waiting for that process (a rendezvous, a store barrier) need not wait for its
        # heartbeat to go stale.
        coordinator.mark_dead(runtime_node(node, incarnation - 1))
        emit({"type": "rejoining", "incarnation": incarnation, "runtime_node": runtime_node(node, incarnation)})
    me = runtime_node(node, incarnation)
    worker_spec = build_worker_spec(spec, node=me, joining=incarnation > 0 or node >= initial_nodes,
                                    out_dir=out_dir)

    class AgentWorker(Worker):
        def emit(self, record: dict[str, Any]) -> None:
            super().emit(record)
            if record.get("event") == "generation":
                emit({"type": "generation", "generation": record["generation"], "step": record.get("start_step"),
                      "members": record.get("members")})
            elif record.get("event") == "spare":
                emit({"type": "spare", "generation": record["generation"]})

    def on_step(record: dict[str, Any]) -> None:
        emit(metrics_message(record, generation=generation.number))

    watcher = _Watcher(args.control, work_dir / "notice", node, coordinator, runtime_node=me,
                       stop=work_dir / f"stop-{job.id}")
    watcher.start()
    try:
        summary = AgentWorker(worker_spec, on_step).run()
    except Fenced as exc:
        emit({"type": "fenced", "reason": str(exc)})
        return EXIT_FENCED
    except JobCannotContinue as exc:
        emit({"type": "failed", "reason": exc.reason})
        return EXIT_JOB_FAILED
    except Exception:
        # A crash: this process is about to go. Say so in the store at once, so the survivors
        # regroup without waiting for its heartbeat to go stale (2.5 s in the restart test); the
        # agent starts the worker again as a new incarnation. Best effort: the store may be gone.
        with contextlib.suppress(Exception):
            coordinator.mark_dead(me)
        raise
    finally:
        watcher.done.set()
        del store
        if dist.is_initialized():
            dist.destroy_process_group()
    outcome = summary["outcome"]
    kind = "done" if outcome in ("done", "done_elsewhere") else "stopped" if outcome == "stopped" else "left"
    emit({"type": kind, "step": summary["committed"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
