"""Recoveries told: what `spotpipe train` says about every new generation of its ranks.

The ranks log each generation they form (`event: generation`: its number, the step it starts from,
the reason, the ranks lost, leaving and joined, the members), the failure that ended the one before
(`failure_detected`) and when each is ready to train (`generation_ready`), beside their step records.
`Recoveries` reads those records (in any order, from every rank) and tells each generation after the
first once: what happened, the members it trains with, the seconds from the failure to the last rank
ready, and the steps trained again (committed before the failure, at or after the step it restarts
from). `spotpipe.json` keeps the list (`recoveries`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class Recovery:
    generation: int
    start_step: int
    """Steps done when the generation starts (it trains step `start_step + 1` first)."""
    lost: list[int]
    leaving: list[int]
    joined: list[int]
    members: list[int]
    reason: str
    seconds: float | None
    """From the failure (or the generation's forming, for a planned leave) to its last rank ready."""
    steps_redone: int

    def line(self) -> str:
        what = []
        if self.lost:
            what.append(f"lost rank{'s' if len(self.lost) > 1 else ''} {_ranks(self.lost)}")
        if self.leaving:
            what.append(f"rank{'s' if len(self.leaving) > 1 else ''} {_ranks(self.leaving)} left on notice")
        if self.joined:
            what.append(f"rank{'s' if len(self.joined) > 1 else ''} {_ranks(self.joined)} joined")
        took = f"{self.seconds:.2f} s" if self.seconds is not None else "time unknown"
        return (f"recovery: generation {self.generation}: {', '.join(what) or _short(self.reason)}; "
                f"{len(self.members)} ranks train on from step {self.start_step}, {self.steps_redone} step(s) "
                f"redone, {took}")


def _ranks(nodes: list[int]) -> str:
    return ", ".join(str(n) for n in nodes)


def _short(reason: str) -> str:
    return reason.splitlines()[0][:120] if reason else "regrouped"


class Recoveries:
    """Collects the ranks' generation records; `new()` returns the recoveries not told yet."""

    def __init__(self) -> None:
        self.formed: dict[int, dict[str, Any]] = {}
        self.failed_at: dict[int, float] = {}  # generation the failure ended -> earliest report
        self.ready_at: dict[int, float] = {}  # generation -> latest rank ready
        self.ready_ranks: dict[int, set[int]] = {}
        self.committed_at: dict[int, float] = {}  # runtime step index -> earliest commit seen
        self.told: dict[int, Recovery] = {}

    def add(self, record: dict[str, Any]) -> None:
        event, at = record.get("event"), float(record.get("time") or 0.0)
        if event is None and record.get("loss") is not None and "step" in record:
            step = int(record["step"])
            self.committed_at[step] = min(at, self.committed_at.get(step, at))
        elif event == "generation" and int(record.get("generation") or 0) > 0:
            self.formed.setdefault(int(record["generation"]), {**record})
        elif event == "failure_detected" and record.get("generation") is not None:
            ended = int(record["generation"])
            self.failed_at[ended] = min(at, self.failed_at.get(ended, at))
        elif event == "generation_ready" and record.get("generation") is not None:
            generation = int(record["generation"])
            self.ready_at[generation] = max(at, self.ready_at.get(generation, at))
            self.ready_ranks.setdefault(generation, set()).add(int(record.get("node", -1)))

    def new(self, *, final: bool = False) -> list[Recovery]:
        """Generations formed whose every member is ready (or, with `final`, all of them) and not told yet."""
        out = []
        for generation, formed in sorted(self.formed.items()):
            if generation in self.told:
                continue
            members = [int(m) for m in formed.get("members") or []]
            if not final and not set(members) <= self.ready_ranks.get(generation, set()):
                continue
            start = int(formed.get("start_step") or 0)
            began = self.failed_at.get(generation - 1, float(formed.get("time") or 0.0))
            ready = self.ready_at.get(generation)
            done_before = [s for s, at in self.committed_at.items() if at < float(formed.get("time") or 0.0)]
            redone = max(0, (max(done_before) + 1 if done_before else 0) - start)
            recovery = Recovery(
                generation=generation, start_step=start, lost=[int(n) for n in formed.get("lost") or []],
                leaving=[int(n) for n in formed.get("leaving") or []],
                joined=[int(n) for n in formed.get("joined") or []], members=members,
                reason=str(formed.get("reason") or ""), steps_redone=redone,
                seconds=round(ready - began, 3) if ready is not None else None)
            self.told[generation] = recovery
            out.append(recovery)
        return out

    def summary(self) -> list[dict[str, Any]]:
        return [asdict(r) for _, r in sorted(self.told.items())]
