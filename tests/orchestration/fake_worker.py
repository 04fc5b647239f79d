"""A stand-in for the runtime worker that speaks the agent's worker protocol (see
agent/supervisor.py) without torch: it "trains" one step every STEP_S seconds, prints metrics,
switches generation at step boundaries, and leaves when it is no longer a member."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

STEP_S = float(os.environ.get("FAKE_WORKER_STEP_S", "0.05"))


def emit(message: dict) -> None:
    sys.stdout.write("SPOTPIPE " + json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spec = json.loads(args.spec.read_text())
    instance = spec["instance"]
    generation = spec["generation"]["number"]
    target = spec["job"]["target_steps"]
    step = spec["job"].get("steps_done", 0)
    (Path(spec["work_dir"]) / "worker.pid").write_text(str(os.getpid()))
    while step < target:
        time.sleep(STEP_S)
        step += 1
        emit({"type": "metrics", "step": step, "loss": 1.0 / step, "samples_per_s": 100.0,
              "stage_times": {"0": STEP_S}, "generation": generation})
        control = json.loads(args.control.read_text())
        if control["number"] != generation:
            generation = control["number"]
            members = {m["instance"] for m in control["membership"]}
            emit({"type": "generation", "generation": generation, "step": step})
            if instance not in members:
                return 0
    emit({"type": "done", "step": step})
    return 0


if __name__ == "__main__":
    sys.exit(main())
