"""Faults a test or a benchmark injects into one worker from the inside (`WorkerSpec.faults`, set by
`runtime.train.launcher`): a kill, a stop (hung), a notice or a delay at an exact point of a step,
a validation pass or a state hand-over. A production worker has none and never builds an injector.

A fault is {"kind": "kill"|"stop"|"notice"|"delay", "step": k, "at": action index or -1 (the middle
one), "delay_s": seconds for "delay", "phase": "step" (default), "validation" or "transfer"}."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from runtime.distributed.coordinator import Coordinator
from runtime.distributed.generation_plan import GenerationPlan


class FaultInjector:
    """Fires each of one worker's faults once, where it says. `emit` records the injection (so a
    test can tell it happened); `give_notice` is the worker's own notice flag, set by a "notice"."""

    def __init__(self, faults: list[dict[str, Any]], *, emit: Callable[[dict[str, Any]], None],
                 give_notice: Callable[[], None]) -> None:
        self.faults = faults
        self.fired: set[int] = set()
        self._emit = emit
        self._give_notice = give_notice

    def step_hook(self, step: int, phase: str = "step") -> Callable[[int, int], None]:
        """The executor's per-action hook for `step` (a training step, or with phase "validation"
        the validation pass on the parameters after `step` steps)."""
        return lambda index, total: self.at_action(step, index, total, phase)

    def at_action(self, step: int, index: int, total: int, phase: str = "step") -> None:
        """Before action `index` of `total` of `step`: fire the faults placed there."""
        for i, fault in enumerate(self.faults):
            if i in self.fired or fault.get("phase", "step") != phase or fault["step"] != step:
                continue
            at = fault.get("at", -1)
            if (at if at >= 0 else total // 2) != index:
                continue
            self._inject(i, fault, step)

    def at_transfer(self, plan: GenerationPlan, index: int, total: int, *, coord: Coordinator,
                    timeout_s: float) -> None:
        """Faults with phase "transfer" fire in the first hand-over whose start step is at least
        the fault's `step` (any, if None): before this node's transfer message `index` of `total`
        (messages it sends or receives, in plan order; `at` -1 = the middle one; `at` == their
        number = after the last one, before waiting for its sends). A node not taking part
        (`total` 0) fires at its index 0, once every node that does has met at the transfer barrier
        (so the hand-over is under way), or after `timeout_s`."""
        for i, fault in enumerate(self.faults):
            if i in self.fired or fault.get("phase") != "transfer":
                continue
            if fault.get("step") is not None and plan.start_step < fault["step"]:
                continue
            at = fault.get("at", -1)
            if (at if at >= 0 else total // 2) != index:
                continue
            if total == 0:
                involved = sorted({n for _, src, dst in plan.transfers for n in (src, dst)})
                keys = [f"gen/{plan.generation}/xfer/ready/{n}" for n in involved]
                deadline = time.monotonic() + timeout_s
                while not coord.store.check(keys) and time.monotonic() < deadline:
                    time.sleep(0.002)
            self._inject(i, fault, plan.start_step)

    def _inject(self, i: int, fault: dict[str, Any], step: int) -> None:
        self.fired.add(i)
        self._emit({"event": f"inject_{fault['kind']}", "step": step, "phase": fault.get("phase", "step")})
        if fault["kind"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault["kind"] == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault["kind"] == "notice":
            self._give_notice()
        elif fault["kind"] == "delay":
            time.sleep(fault["delay_s"])  # a slow link or a slow step: late, not lost
