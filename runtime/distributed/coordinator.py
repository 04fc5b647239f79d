"""The store protocol between workers and whoever supervises them (the node agent or the launcher).

All keys live under `<job>/` on a TCPStore hosted outside the workers (a worker's death must not take
the store with it):

- `hb/<node>`: wall-clock time of the node's last heartbeat (a thread, every heartbeat_timeout / 5).
- `dead/<node>`: set by a supervisor that saw the process exit; faster than a stale heartbeat.
- `notice/<node>`: a preemption notice for the node; it finishes its step, hands over, leaves.
- `joins`, `join/<i>`: replacements asking to join; `joined/<node>`: the generation that took it.
- `spare/<node>`: a joiner the job has no slot for yet, with the generation that said so (its plan's
  `spare`, or its first member when the generation has no empty slot or holds joiners for a batch,
  `membership.joiners_worth_a_regroup`); it stands by, heartbeating, until a later generation takes
  it (`joined/<node>`) or the job ends.
- `starts/<n>`: how many workers the agent of control-plane node n started; each restart joins as a
  new node id, so a node id's keys above never need clearing (`agent/worker_entry.py::runtime_node`).
- `done`: the job committed its last step; `failed`: why no next generation can run.
- `left/<node>`: the node left on its notice (its state handed over); it is gone, not dead.
- `gen/<g>/abort`: a member gave generation g up (first reason wins); members still setting g up
  (transfers, store barriers) stop waiting for it. `gen/<g>/started`: g committed its first step.
- `gen/<g>/alive/<node>`: a member's record for forming generation g; `gen/<g>/plan`: the plan.
- `gen/<g>/...`: prefixes of generation g's process groups.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch.distributed as dist

from runtime.distributed.generation_plan import GenerationPlan

DECIDER_GRACE_S = 0.25
"""How long the other members wait for the lowest member's plan before computing one themselves."""


def connect(address: str, *, timeout_s: float = 30.0) -> dist.TCPStore:
    """A client connection to the job's TCPStore at `host:port`."""
    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def serve(port: int = 0, *, timeout_s: float = 60.0) -> dist.TCPStore:
    """Host a TCPStore in this process (the launcher or agent); port 0 picks a free one."""
    return dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


class Coordinator:
    """Typed access to the job's keys; used by workers, the launcher and the agent alike."""

    def __init__(self, store: dist.Store, job: str) -> None:
        self.store = dist.PrefixStore(job, store)

    # -- supervisor side ----------------------------------------------------------------------
    def notify(self, node: int) -> None:
        """Deliver a preemption notice to `node` (it leaves after its current step)."""
        self.store.set(f"notice/{node}", "1")

    def mark_dead(self, node: int) -> None:
        """Tell survivors at once that `node`'s process is gone."""
        self.store.set(f"dead/{node}", "1")

    def request_join(self, node: int) -> None:
        """Register a replacement; the job takes it at its next step boundary."""
        self.store.set(f"joinreq/{node}", "1")
        index = self.store.add("joins", 1)
        self.store.set(f"join/{index}", str(node))

    def latest_generation(self) -> int:
        """The newest generation with a published plan (-1 before the job started)."""
        return self.store.add("generation", 0) - 1

    # -- worker side --------------------------------------------------------------------------
    def notice_pending(self, node: int) -> bool:
        """True once a notice for `node` was delivered."""
        return self.store.check([f"notice/{node}"])

    def join_count(self) -> int:
        """Replacements registered so far."""
        return self.store.add("joins", 0)

    def joiners(self, start: int, end: int) -> list[int]:
        """Node ids of join requests start+1..end."""
        keys = [f"join/{i}" for i in range(start + 1, end + 1)]
        if keys:
            self.store.wait(keys)
        return [int(self.store.get(k)) for k in keys]

    def wait_joined(self, node: int, timeout_s: float | None, *, spare: bool = True) -> int | None:
        """Block until a generation includes replacement `node` -- as a member, or (with `spare`) as
        a spare -- and return that generation; None if the job finished (or failed) first.
        `timeout_s` None: no bound (a spare stands by until it is taken or the job ends)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        keys = [f"joined/{node}", *([f"spare/{node}"] if spare else [])]
        while deadline is None or time.monotonic() < deadline:
            for key in keys:  # `joined/` first: a spare taken since it was listed is a member
                if self.store.check([key]):
                    return int(self.store.get(key))
            if self.is_over():
                return None
            time.sleep(0.005)
        raise TimeoutError(f"replacement {node} was not taken within {timeout_s}s")

    def request_stop(self) -> None:
        """Ask the job to checkpoint and stop (a limit it reached: budget, max runtime, max wait)."""
        self.store.set("stop", "1")

    def stop_requested(self) -> bool:
        """True once a stop was asked for."""
        return self.store.check(["stop"])

    def mark_stopped(self) -> None:
        """The job checkpointed and stopped (replacements waiting to join give up)."""
        self.store.set("stopped", "1")

    def mark_failed(self, reason: str) -> None:
        """The job cannot go on (its members agreed on an impossible plan); first reason wins."""
        self.store.compare_set("failed", "", reason)

    def failure(self) -> str | None:
        """Why the job failed, if it did."""
        return self.store.get("failed").decode() if self.store.check(["failed"]) else None

    def mark_left(self, node: int) -> None:
        """`node` left on its notice after handing over; the others stop waiting for it."""
        self.store.set(f"left/{node}", "1")

    def abort(self, generation: int, reason: str) -> None:
        """A member gave `generation` up; whoever still sets it up stops waiting (first reason wins)."""
        self.store.compare_set(f"gen/{generation}/abort", "", reason)

    def aborted(self, generation: int) -> str | None:
        """Why `generation` was given up, if it was."""
        key = f"gen/{generation}/abort"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def mark_started(self, generation: int) -> None:
        """`generation` committed its first step (a node that handed its state over may leave now)."""
        self.store.set(f"gen/{generation}/started", "1")

    def started(self, generation: int) -> bool:
        """True once `generation` committed its first step."""
        return self.store.check([f"gen/{generation}/started"])

    def is_over(self) -> bool:
        """The job finished, failed or stopped."""
        return self.is_done() or self.store.check(["failed"]) or self.store.check(["stopped"])

    def is_done(self) -> bool:
        """The job committed its last step."""
        return self.store.check(["done"])

    def mark_done(self) -> None:
        """The job committed its last step (late replacements give up)."""
        self.store.set("done", "1")

    def write_alive(self, generation: int, node: int, record: dict[str, Any]) -> None:
        """A member's record for forming `generation`."""
        self.store.set(f"gen/{generation}/alive/{node}", json.dumps(record))

    def _marked_gone(self, node: int) -> bool:
        """Marked dead by a supervisor or left on its notice (both for good)."""
        return self.store.check([f"dead/{node}"]) or self.store.check([f"left/{node}"])

    def is_gone(self, node: int, heartbeat_timeout_s: float) -> bool:
        """Marked dead by a supervisor, left on its notice, or no heartbeat for longer than the timeout."""
        if self._marked_gone(node):
            return True
        if not self.store.check([f"hb/{node}"]):
            return False
        return time.time() - float(self.store.get(f"hb/{node}")) > heartbeat_timeout_s

    def read_plan(self, generation: int) -> GenerationPlan | None:
        """The published plan of `generation`, if any (checked: `PlanWireError` names a bad field)."""
        key = f"gen/{generation}/plan"
        return GenerationPlan.from_dict(json.loads(self.store.get(key))) if self.store.check([key]) else None

    def publish_plan(self, generation: int, plan: GenerationPlan) -> GenerationPlan:
        """Publish `plan` unless another member already did; returns the plan that won, as every
        member reads it (from the store's JSON)."""
        payload = json.dumps(plan.to_dict())
        won = self.store.compare_set(f"gen/{generation}/plan", "", payload)
        result = GenerationPlan.from_dict(json.loads(won))
        if won == payload.encode():
            self.store.add("generation", 1)
            for node in plan.joined:
                self.store.set(f"joined/{node}", str(generation))
            # A joiner that got no slot learns it now (it used to wait for `joined/` until the job
            # ended or its rendezvous timeout, 60 s, and then exited as a failed worker).
            for node in plan.spare:
                self.tell_spare(node, generation)
        return result

    def tell_spare(self, node: int, generation: int) -> None:
        """Tell joiner `node` that `generation` has no slot for it (or holds it for a batch): it stands by."""
        self.store.set(f"spare/{node}", str(generation))

    def form_generation(
        self,
        generation: int,
        *,
        node: int,
        record: dict[str, Any],
        expected: Iterable[int],
        decide: Callable[[dict[int, dict[str, Any]]], GenerationPlan],
        heartbeat_timeout_s: float,
        timeout_s: float,
        answer_timeout_s: float | None = None,
    ) -> GenerationPlan:
        """Rendezvous of `generation`: write our record, wait until every expected member has answered
        or is gone, then publish `decide(records)` (first writer wins) and return the winning plan.

        Gone = marked dead by a supervisor, or heartbeat older than `heartbeat_timeout_s`, or (once we
        waited `answer_timeout_s`, the op timeout: a live member fails its own calls by then) not
        answering with a heartbeat older than 1.5 x `answer_timeout_s` -- a hung (stopped) node.
        """
        self.write_alive(generation, node, record)
        expected = sorted(set(expected))
        began = time.monotonic()
        deadline = began + timeout_s
        complete_since = None
        answered: list[int] = []
        gone: set[int] = set()
        while True:
            plan = self.read_plan(generation)
            if plan is not None:
                return plan
            # Ask only about members not settled yet, all at once first: every survivor polls every
            # 2 ms, and one store round trip per member per poll (32 members: ~16,000 a second on
            # the one store) slowed the rendezvous that every recovery waits for.
            unsettled = [n for n in expected if n not in answered and n not in gone]
            keys = [f"gen/{generation}/alive/{n}" for n in unsettled]
            if unsettled and self.store.check(keys):
                answered += unsettled
            else:
                answered += [n for n, key in zip(unsettled, keys, strict=True) if self.store.check([key])]
            limit = heartbeat_timeout_s
            if answer_timeout_s is not None and time.monotonic() - began > answer_timeout_s:
                limit = min(limit, 1.5 * answer_timeout_s)
            missing = [n for n in expected if n not in answered]
            # Marked dead or left stays so; a stale heartbeat is asked again (the limit shrinks).
            gone |= {n for n in missing if n not in gone and self._marked_gone(n)}
            missing = [n for n in missing if n not in gone and not self.is_gone(n, limit)]
            if not missing:
                # The lowest answered member decides; the others give it DECIDER_GRACE_S before they
                # decide too (first writer still wins). Planning can cost tens of ms of CPU (recycle
                # spill), which every survivor computing at once on shared cores would multiply.
                complete_since = complete_since or time.monotonic()
                if node != min(answered) and time.monotonic() - complete_since < DECIDER_GRACE_S:
                    time.sleep(0.002)
                    continue
                records = {n: json.loads(self.store.get(f"gen/{generation}/alive/{n}")) for n in sorted(answered)}
                return self.publish_plan(generation, decide(records))
            if time.monotonic() > deadline:
                raise TimeoutError(f"generation {generation} did not form within {timeout_s}s; missing {missing}")
            time.sleep(0.002)


def wait_ready(
    coord: Coordinator,
    generation: int | str,
    node: int,
    members: list[int],
    *,
    heartbeat_timeout_s: float,
    timeout_s: float,
    abort_of: int | None = None,
) -> None:
    """Store barrier before building a generation's process group.

    gloo's group constructor waits for every peer while holding the GIL, which starves our
    heartbeat thread; meeting here first (sleeping, GIL released) keeps that wait short.
    `abort_of`: the generation being set up; the barrier fails at once when a member gave it up
    (e.g. a hand-over it took part in failed), instead of waiting for that live member until
    `timeout_s`.
    """
    store = coord.store
    store.set(f"gen/{generation}/ready/{node}", "1")
    keys = [f"gen/{generation}/ready/{m}" for m in members]
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + 0.1
    while not store.check(keys):
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"generation {generation}: members not ready within {timeout_s}s")
        if now > next_check:
            next_check = now + 0.1
            gone = [
                m
                for m in members
                if not store.check([f"gen/{generation}/ready/{m}"]) and coord.is_gone(m, heartbeat_timeout_s)
            ]
            if gone:
                raise RuntimeError(f"generation {generation}: members {gone} are gone before it formed")
            if abort_of is not None and (why := coord.aborted(abort_of)) is not None:
                raise RuntimeError(f"generation {abort_of} was given up by a member: {why}")
        time.sleep(0.002)


class Heartbeat:
    """Writes `hb/<node>` from a daemon thread over its own store connection."""

    def __init__(self, address: str, job: str, node: int, interval_s: float) -> None:
        self._store = dist.PrefixStore(job, connect(address))
        self._node = node
        self._interval = interval_s
        self._stop = threading.Event()
        self.max_gap_s = 0.0
        """Longest observed time between two beats (how starved this thread got)."""
        self.beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{node}", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        """Write one heartbeat now."""
        self._store.set(f"hb/{self._node}", repr(time.time()))

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._interval):
            now = time.monotonic()
            self.max_gap_s = max(self.max_gap_s, now - last)
            last = now
            try:
                self.beat()
            except Exception:  # the store is gone: the job is over; the worker's own calls will time out
                return

    def stop(self) -> None:
        """Stop beating (on a clean exit)."""
        self._stop.set()
