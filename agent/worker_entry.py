"""The worker process the agent starts: an adapter from the agent's worker protocol (see
`agent/supervisor.py`) to the runtime's worker (`runtime.worker`).

    python -m agent.worker_entry --spec SPEC --control CONTROL

It builds the runtime's `WorkerSpec` from the job and this node's assignment, prints each committed
step as a `SPOTPIPE {"type": "metrics", ...}` line, and watches two files at a short interval:
CONTROL (the newest generation: if this node is no longer a member, it asks the runtime to leave
at its next step boundary) and `notice` in the work directory (the agent saw an interruption
notice in the metadata endpoint: leave at once, before the control plane has even answered).
The runtime itself forms its generations through the job's rendezvous store. When the runtime
finds the job cannot go on, the worker prints `{"type": "failed", "reason": ...}` and exits with
EXIT_JOB_FAILED.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

WATCH_INTERVAL_S = 0.02
# Exit code of a worker whose job cannot go on (the runtime agreed on an impossible plan); the agent
# reports it with the reason and does not restart the worker.
EXIT_JOB_FAILED = 4
# Exit code of a worker the job dropped (declared gone while it was hung): restarting it as it was
# would only be dropped again.
EXIT_FENCED = 3


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write("SPOTPIPE " + json.dumps(message) + "\n")
    sys.stdout.flush()


def job_config(job: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """The runtime's JobConfig (as a dict) for a control-plane job: the model spec's names mapped to
    the runtime's, the layout's dp/pp/strategy, and `plan["runtime"]` overrides (lr, device_time,
    op_timeout_s, schedule, ...)."""
    spec = job.get("model_spec") or {}
    plan = job.get("plan") or {}
    kind = spec.get("kind", "mlp")
    model: dict[str, Any] = {"kind": kind, "n_layer": spec.get("layers", 4), "n_embd": spec.get("d_model", 32)}
    if kind == "gpt":
        model.update(n_head=spec.get("heads", 2), seq_len=spec.get("seq_len", 16), vocab_size=spec.get("vocab", 64))
    elif "in_features" in spec:
        model["in_features"] = spec["in_features"]
    dp, pp = int(layout["dp"]), int(layout["pp"])
    total_microbatches = int(spec.get("micro_batches", 2 * dp))
    config = {
        "model": model, "dp": dp, "pp": pp, "microbatches": max(1, total_microbatches // dp),
        "global_batch": int(spec.get("global_batch", 8)), "strategy": layout.get("strategy", "recycle"),
        "steps": int(job["target_steps"]), "seed": int(plan.get("seed", 0)),
    }
    config.update(plan.get("runtime") or {})
    return config


class _Watcher(threading.Thread):
    """Turns the agent's files into runtime notices for this node, and tells the runtime about
    members the control plane dropped before their worker ever started."""

    def __init__(self, control: Path, notice: Path, node: int, coordinator: Any) -> None:
        super().__init__(name="control-watch", daemon=True)
        self.control = control
        self.notice = notice
        self.node = node
        self.coordinator = coordinator
        self.done = threading.Event()
        self.notified = False

    def _leave(self, why: str) -> None:
        if not self.notified:
            self.notified = True
            self.coordinator.notify(self.node)
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
                text = self.control.read_text()
                if text != seen:
                    seen = text
                    generation = json.loads(text)
                    previous, members = members, {m.get("node") for m in generation.get("membership", [])}
                    if previous is not None:
                        self._forget_unstarted(previous - members)
                    if self.node not in members:
                        self._leave(f"not a member of generation {generation.get('number')}")
            except (OSError, ValueError):
                continue
            except Exception:  # the store went away: the worker's own calls will fail and it exits
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    job, generation, assignment = spec["job"], spec["generation"], spec["assignment"]
    layout = generation["layout"]
    work_dir = Path(spec["work_dir"])
    out_dir = work_dir / "out"
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch.distributed as dist

    from runtime.coordinator import Coordinator, connect
    from runtime.worker import Fenced, JobCannotContinue, Worker, WorkerSpec

    node = int(assignment["node"])
    initial_nodes = int(layout["dp"]) * int(layout["pp"])
    worker_spec = WorkerSpec(
        job_id=f"job{job['id']}", node=node, rendezvous=layout["rendezvous"], config=job_config(job, layout),
        generation=0, joining=node >= initial_nodes, out_dir=str(out_dir),
    )

    class AgentWorker(Worker):
        def _emit(self, record: dict[str, Any]) -> None:
            super()._emit(record)
            if record.get("event") == "generation":
                emit({"type": "generation", "generation": record["generation"], "step": record.get("start_step"),
                      "members": record.get("members")})

    def on_step(record: dict[str, Any]) -> None:
        emit({"type": "metrics", "step": int(record["step"]) + 1, "loss": record.get("loss"),
              "samples_per_s": record.get("samples_per_s"), "stage_times": record.get("stage_times_s") or {},
              "generation": generation["number"], "runtime_generation": record.get("generation")})

    store = connect(layout["rendezvous"], timeout_s=60)
    watcher = _Watcher(args.control, work_dir / "notice", node, Coordinator(store, worker_spec.job_id))
    watcher.start()
    try:
        summary = AgentWorker(worker_spec, on_step).run()
    except Fenced as exc:
        emit({"type": "fenced", "reason": str(exc)})
        return EXIT_FENCED
    except JobCannotContinue as exc:
        emit({"type": "failed", "reason": exc.reason})
        return EXIT_JOB_FAILED
    finally:
        watcher.done.set()
        del store
        if dist.is_initialized():
            dist.destroy_process_group()
    emit({"type": "done" if summary["outcome"] == "done" else "left", "step": summary["committed"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
