"""Process groups of one generation, built directly on a TCPStore and torn down without a restart.

We create `ProcessGroupGloo` objects ourselves (not the global default group) so a generation's
groups can be dropped and rebuilt in-process: dropping every reference closes the sockets, which
makes the peers' pending gloo calls fail at once ("Connection closed by peer") instead of waiting
for their timeout. Every blocking call is bounded by `timeout`.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from runtime.distributed.grad_order import RunSum, chunk_windows

_ALLREDUCE_TAG = 1 << 24
"""Tags at and above this carry gradient reduce-scatter messages (and the finished sums sent to
replicas); below, activations and gradients."""
_GATHER_TAG = 4 << 24
"""Tag of the gradient all-gather messages (a pair of owners exchanges both phases of one layer run,
so the phases need tags of their own)."""


POISON = -1.2345e38
"""First element of a poisoned message (the rest is NaN): "I failed, give up this step"."""


_COMMIT_TAG = 2 << 24
"""Tag of the per-step commit messages."""
_NORM_TAG = 3 << 24
"""Tag of the per-step gradient-norm sums (`sum_norms`), before any optimizer step."""


class PeerAborted(RuntimeError):
    """A peer failed this step and told us so instead of letting us wait for our timeout."""


def poison_like(tensor: torch.Tensor) -> torch.Tensor:
    """A message of the same shape that makes its receiver abort the step."""
    out = torch.full_like(tensor, float("nan"))
    out.view(-1)[0] = POISON
    return out


def is_poison(tensor: torch.Tensor) -> bool:
    """True for a message made by `poison_like` (real activations never look like this)."""
    flat = tensor.view(-1)
    return bool(flat[0] == POISON) and (flat.numel() == 1 or bool(torch.isnan(flat[1])))


class AllReduce:
    """An all-reduce in flight: our contribution, our chunk of the sum, and the posted receives."""

    def __init__(
        self,
        owners: tuple[int, ...],
        mine: torch.Tensor,
        recvs: dict[int, tuple[torch.Tensor, Any]],
        *,
        run: RunSum | None = None,
        gathers: dict[int, tuple[torch.Tensor, Any]] | None = None,
        receive_only: bool = False,
        forward_to: tuple[int, ...] = (),
        tag: int = 0,
    ) -> None:
        self.owners = owners
        self.mine = mine
        self.run = run
        self.recvs = recvs
        """Reduce-scatter: each other owner's piece of our chunk (a replica: the finished sum)."""
        self.gathers = gathers or {}
        """All-gather: each other owner's finished chunk."""
        self.receive_only = receive_only
        """A replica: it only receives the finished sum."""
        self.forward_to = forward_to
        """Replicas this node sends the finished sum to."""
        self.tag = tag
        self.chunk: torch.Tensor | None = None
        """Our folded chunk of the sum, once `Comm.reduce_chunk` made it."""
        self.gathered = False
        """Our chunk went out to the other owners (or, abandoned, poison in its place)."""
        self.forwarded = False
        """The finished sum went out to our replicas."""


class Comm:
    """The process group of one generation, addressed by node id, not by rank.

    Everything (point-to-point, gradient all-reduces among the owners of a layer run, the per-step
    commit) runs on the one `world` group on purpose: gloo fails every pending call of a group as
    soon as any of its connections breaks, so a dead node wakes every survivor at once. Gradient
    all-reduces are a reduce-scatter, whose chunk owners fold their chunk in the fixed order of
    `runtime.distributed.grad_order`, then an all-gather: every owner gets the bit-identical result (replicas
    stay identical, which bamboo relies on), sending about 2x the gradient's bytes, not (owners-1)x.
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        prefix: str,
        node: int,
        members: Sequence[int],
        timeout_s: float,
        watch: Callable[[], str | None] | None = None,
    ) -> None:
        self.node = node
        self.watch = watch
        """If set (hand-overs), blocking waits ask it every WATCH_POLL_S and give up with its answer
        (see `wait_watched`); training steps wait plainly, their timeout is short."""
        self.peer_watch: Callable[[int | None], str | None] | None = None
        """Training steps whose bound is long (`set_timeout`): asked, with the awaited peer (None:
        any member), every WATCH_POLL_S during a wait; a hung peer (stale heartbeat) ends the wait
        with its answer long before the bound."""
        self.watch_above_s = math.inf
        """Waits bounded by more than this are watched with `peer_watch`; shorter ones wait plainly
        (they end soon anyway, and cost no thread)."""
        self.members = tuple(members)
        self.rank_of = {n: i for i, n in enumerate(self.members)}
        self.timeout = datetime.timedelta(seconds=timeout_s)
        rank = self.members.index(node)
        self.world: dist.ProcessGroup | None = dist.ProcessGroupGloo(
            dist.PrefixStore(f"{prefix}/world", store), rank, len(self.members), self.timeout
        )
        # Every Work stays referenced here until it completed: destroying a pending gloo Work blocks.
        self.pending: list[Any] = []
        self.bytes_sent = 0
        """Bytes handed to `send` so far (every message: activations, gradients, commits)."""

    def set_timeout(self, timeout_s: float) -> None:
        """Bound every later wait by `timeout_s` (a training step's bound, `JobConfig.step_timeout`);
        the group keeps the timeout it was built with for everything else."""
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def _world(self) -> dist.ProcessGroup:
        if self.world is None:
            raise RuntimeError("communication of this generation was closed")
        return self.world

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        """Non-blocking send; completion is awaited by `wait_sends()` before the step commits."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.pending.append((True, self._world().send([tensor], self.rank_of[dst], tag), tensor))

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None:
        """Blocking receive, bounded by the generation's timeout."""
        work = self._world().recv([tensor], self.rank_of[src], tag)
        self.pending.append((False, work, tensor))
        self._wait(work, src)
        if is_poison(tensor):
            raise PeerAborted(f"node {src} aborted the step (message tag {tag})")

    def wait_sends(self) -> None:
        """Wait for every outstanding send (bounded; receives were waited for where they were used,
        and waiting twice for a gloo receive blocks), then forget all of them."""
        for is_send, work, _ in self.pending:
            if is_send:
                self._wait(work)
        self.pending.clear()

    def settle_sends(self) -> int:
        """Before the process ends: wait for our outstanding sends (each bounded by the timeout) and
        count those that failed. A receiver that died is no longer our concern, so this never raises.

        Why: gloo completes a send only once its receiver posted the matching receive. The first
        member's last `commit` sends each member the step's total and returns at once; if its
        process then ended, its sockets closed before a slower member posted that receive, whose
        read failed ("Connection reset by peer"): it never learnt that the last step committed.
        Also, a gloo Work reports `is_completed()` only once waited for, so a group closed with
        un-waited sends is never destroyed by `bury()`: every generation ended by a notice or a
        join left one group parked (its sockets and threads) for the rest of the job."""
        failed = 0
        for is_send, work, _ in self.pending:
            if is_send:
                try:
                    self._wait(work)
                except RuntimeError:
                    failed += 1
        self.pending = [entry for entry in self.pending if not entry[0]]
        return failed

    def _wait(self, work: Any, peer: int | None = None) -> None:
        """Wait for `work` (a call with `peer`, None: unknown), bounded by the timeout."""
        if self.watch is not None:
            wait_watched(work, self.timeout.total_seconds(), self.watch)
        elif self.peer_watch is not None and self.timeout.total_seconds() > self.watch_above_s:
            peer_watch = self.peer_watch
            wait_watched(work, self.timeout.total_seconds(), lambda: peer_watch(peer))
        else:
            work.wait(self.timeout)

    def allreduce(
        self,
        tensor: torch.Tensor,
        owners: tuple[int, ...],
        tag: int,
        run: RunSum,
        replicas: tuple[int, ...] = (),
    ) -> AllReduce:
        """Start the sum of the layer run `run` over `owners`; finish with `finish_allreduce`.

        `tensor` is our contribution (`GradAccumulator.contribution`). Reduce-scatter: the finished
        sum is cut into one chunk per computing owner (`chunk_windows`); we send each other owner our
        piece of its chunk now and post the receives of both phases. Owners that only keep a replica
        (`replicas`, bamboo) have nothing to add: they receive the finished sum from one computing
        owner instead (their `tensor` has the size of the finished sum).
        """
        computing = tuple(n for n in owners if n not in replicas)
        if self.node in replicas:
            source = computing[replicas.index(self.node) % len(computing)]
            buf = torch.empty_like(tensor)
            work = self._world().recv([buf], self.rank_of[source], _ALLREDUCE_TAG + tag)
            self.pending.append((False, work, buf))
            return AllReduce(computing, tensor, {source: (buf, work)}, receive_only=True)
        windows = chunk_windows(run.numel, len(computing))
        ours = windows[computing.index(self.node)]
        recvs: dict[int, tuple[torch.Tensor, Any]] = {}
        gathers: dict[int, tuple[torch.Tensor, Any]] = {}
        for other, window in zip(computing, windows, strict=True):
            if other == self.node:
                continue
            piece = run.piece(self.node, tensor, window)
            if piece.numel():
                self.send(piece, other, _ALLREDUCE_TAG + tag)
            if run.piece_numel(other, ours):
                recvs[other] = self._post_recv(torch.empty(run.piece_numel(other, ours)), other, _ALLREDUCE_TAG + tag)
            if window[1] > window[0]:
                gathers[other] = self._post_recv(torch.empty(window[1] - window[0]), other, _GATHER_TAG + tag)
        mine = computing.index(self.node)
        forward = tuple(r for i, r in enumerate(replicas) if i % len(computing) == mine)
        return AllReduce(computing, tensor, recvs, run=run, gathers=gathers, forward_to=forward, tag=tag)

    def _post_recv(self, buf: torch.Tensor, src: int, tag: int) -> tuple[torch.Tensor, Any]:
        work = self._world().recv([buf], self.rank_of[src], tag)
        self.pending.append((False, work, buf))
        return buf, work

    def _received(
        self, handle: AllReduce, recvs: dict[int, tuple[torch.Tensor, Any]], phase: str
    ) -> dict[int, torch.Tensor]:
        """Wait for `recvs` in owner order; a poisoned one aborts the step."""
        out = {}
        for owner in handle.owners:
            if owner in recvs:
                part, work = recvs[owner]
                self._wait(work, owner)
                if is_poison(part):
                    raise PeerAborted(f"node {owner} aborted the step ({phase})")
                out[owner] = part
        return out

    def reduce_chunk(self, handle: AllReduce) -> None:
        """Reduce-scatter's end: fold our chunk from the owners' pieces (fixed order) and send it to
        the other owners. Call it for every all-reduce of the step before `finish_allreduce` of any:
        owners finish their runs in different orders, and one waiting for a run's gathered chunks
        before sending its chunks of another would wait for a peer doing the converse (a deadlock)."""
        if handle.receive_only or handle.chunk is not None:
            return
        run = handle.run
        assert run is not None
        ours = chunk_windows(run.numel, len(handle.owners))[handle.owners.index(self.node)]
        parts = self._received(handle, handle.recvs, "reduce-scatter")
        parts[self.node] = run.piece(self.node, handle.mine, ours)
        chunk = run.fold(parts, ours)
        for other in handle.owners:
            if other != self.node and chunk.numel():
                self.send(chunk, other, _GATHER_TAG + handle.tag)
        handle.chunk = chunk
        handle.gathered = True

    def finish_allreduce(self, handle: AllReduce) -> torch.Tensor:
        """All-gather: our chunk (`reduce_chunk`) and the other owners' into the finished sum, then
        pass it on to the replicas this node serves."""
        if handle.receive_only:
            return self._received(handle, handle.recvs, "all-reduce")[next(iter(handle.recvs))]
        self.reduce_chunk(handle)
        run = handle.run
        assert run is not None and handle.chunk is not None
        windows = chunk_windows(run.numel, len(handle.owners))
        total = torch.empty(run.numel)
        gathered = self._received(handle, handle.gathers, "all-gather")
        gathered[self.node] = handle.chunk
        for owner, (start, stop) in zip(handle.owners, windows, strict=True):
            if owner in gathered:
                total[start:stop] = gathered[owner]
        for replica in handle.forward_to:
            self.send(total, replica, _ALLREDUCE_TAG + handle.tag)
        handle.forwarded = True
        return total

    def abandon_allreduce(self, handle: AllReduce) -> None:
        """We give up a started all-reduce: poison what we still owe (our chunk to the other owners,
        the finished sum to our replicas), so nobody waits for it until the timeout. Our receives
        were posted when it started."""
        if handle.receive_only or handle.run is None:
            return
        windows = chunk_windows(handle.run.numel, len(handle.owners))
        start, stop = windows[handle.owners.index(self.node)]
        if not handle.gathered and stop > start:
            for other in handle.owners:
                if other != self.node:
                    self.send_poison(torch.empty(stop - start), other, _GATHER_TAG + handle.tag)
        if not handle.forwarded:
            for replica in handle.forward_to:
                self.send_poison(torch.empty(handle.run.numel), replica, _ALLREDUCE_TAG + handle.tag)
        handle.gathered = handle.forwarded = True

    def send_poison(self, like: torch.Tensor, dst: int, tag: int) -> None:
        """Tell `dst`, which may be blocked waiting for this message, that we abandoned the step.
        Without this a survivor blocked on another survivor would wait for its full timeout."""
        with contextlib.suppress(RuntimeError):  # the peer may be gone too
            self.send(poison_like(like), dst, tag)

    def drain(self, like: torch.Tensor, src: int, tag: int) -> None:
        """Accept (and ignore) a message of a step we abandoned: post its receive, never wait for it.

        gloo completes a send only once its receiver posted the matching receive, and a group we
        close with calls pending is parked with its sockets open, so a peer that already sent us
        this message would otherwise wait in `wait_sends` for its full timeout. The peer sends it
        for real, or poisoned when it abandons the step too, or dies: the receive always completes.
        """
        buf = torch.empty_like(like)
        with contextlib.suppress(RuntimeError):  # the pair to a dead peer may be broken already
            self.pending.append((False, self._world().recv([buf], self.rank_of[src], tag), buf))

    def drain_allreduce(self, owners: tuple[int, ...], tag: int, run: RunSum, replicas: tuple[int, ...] = ()) -> None:
        """Post the receives of an all-reduce we will not take part in (see `drain`): both phases'
        messages from each other computing owner, or a replica's finished sum."""
        computing = tuple(n for n in owners if n not in replicas)
        if self.node in replicas:
            source = computing[replicas.index(self.node) % len(computing)]
            self.drain(torch.empty(run.numel), source, _ALLREDUCE_TAG + tag)
            return
        windows = chunk_windows(run.numel, len(computing))
        ours = windows[computing.index(self.node)]
        for other, (start, stop) in zip(computing, windows, strict=True):
            if other == self.node:
                continue
            if run.piece_numel(other, ours):
                self.drain(torch.empty(run.piece_numel(other, ours)), other, _ALLREDUCE_TAG + tag)
            if stop > start:
                self.drain(torch.empty(stop - start), other, _GATHER_TAG + tag)

    def poison_allreduce(self, owners: tuple[int, ...], tag: int, run: RunSum, replicas: tuple[int, ...] = ()) -> None:
        """Poison every message we owe in an all-reduce we will not take part in: our piece of each
        other owner's chunk, our chunk, and the finished sum to the replicas we serve."""
        computing = tuple(n for n in owners if n not in replicas)
        if self.node in replicas:
            return  # a replica only receives
        windows = chunk_windows(run.numel, len(computing))
        mine = computing.index(self.node)
        start, stop = windows[mine]
        for other, window in zip(computing, windows, strict=True):
            if other == self.node:
                continue
            if run.piece_numel(self.node, window):
                self.send_poison(torch.empty(run.piece_numel(self.node, window)), other, _ALLREDUCE_TAG + tag)
            if stop > start:
                self.send_poison(torch.empty(stop - start), other, _GATHER_TAG + tag)
        for i, replica in enumerate(replicas):
            if i % len(computing) == mine:
                self.send_poison(torch.empty(run.numel), replica, _ALLREDUCE_TAG + tag)

    def commit(self, vector: torch.Tensor) -> torch.Tensor:
        """The per-step barrier: sum `vector` over all members (gathered by the first member, summed
        in member order, sent back). Completing it means every member finished the step.

        Point-to-point rather than a gloo collective so that a member that fails can poison it
        (`poison_commit`) and nobody waits for the timeout in the barrier."""
        return self._sum_members(vector, _COMMIT_TAG)

    def sum_norms(self, vector: torch.Tensor) -> torch.Tensor:
        """The step's gradient-norm exchange: `vector` (float64, one entry per layer, filled by that
        layer's designated owner, zeros elsewhere) summed over all members like `commit`, on its own
        tag; a member that abandons the step first poisons it (`poison_norms`)."""
        return self._sum_members(vector, _NORM_TAG)

    def poison_norms(self, numel: int) -> None:
        """We abandon the step before the norm exchange: unblock whoever waits for us there."""
        self._poison_sum(numel, _NORM_TAG)

    def _sum_members(self, vector: torch.Tensor, tag: int) -> torch.Tensor:
        leader = self.members[0]
        if len(self.members) == 1:
            return vector
        if self.node == leader:
            total = vector.clone()
            for other in self.members[1:]:
                part = torch.empty_like(vector)
                self.recv(part, other, tag)
                total.add_(part)
            for other in self.members[1:]:
                self.send(total, other, tag)
            vector.copy_(total)
        else:
            self.send(vector, leader, tag)
            self.recv(vector, leader, tag)
        return vector

    def poison_commit(self, numel: int) -> None:
        """We abandon the step: unblock whoever waits for us in the commit barrier."""
        self._poison_sum(numel, _COMMIT_TAG)

    def _poison_sum(self, numel: int, tag: int) -> None:
        if self.world is None or len(self.members) == 1:
            return
        like = torch.empty(numel, dtype=torch.float64)
        if self.node == self.members[0]:
            for other in self.members[1:]:
                self.send_poison(like, other, tag)
        else:
            self.send_poison(like, self.members[0], tag)

    def close(self) -> int:
        """Drop the group so its sockets close and peers blocked on us fail fast.

        Destroying a gloo group (or Work) that still has calls pending blocks, holding the GIL, until
        they time out; such a group is parked in a graveyard and destroyed by `bury()` once its
        calls have completed (failed), instead of stalling recovery.
        """
        doomed = (self.world, self.pending)
        self.world = None
        self.pending = []
        _GRAVEYARD.append(doomed)
        return bury()


_GRAVEYARD: list[tuple[Any, list[Any]]] = []


def bury() -> int:
    """Destroy parked groups whose calls have all completed (cheap; call at step boundaries).
    Returns how many groups stay parked."""
    keep = []
    for world, pending in _GRAVEYARD:
        if all(work.is_completed() for _, work, _ in pending):
            pending.clear()
            del world
        else:
            keep.append((world, pending))
    _GRAVEYARD[:] = keep
    return len(keep)


MAX_PARKED_GROUPS = 4
"""Groups given up after failures that a process keeps parked before `reap` destroys the oldest."""


def reap(keep: int = MAX_PARKED_GROUPS) -> int:
    """Destroy the oldest parked groups beyond `keep`; returns how many stay parked.

    A group given up after a failure keeps calls that were never waited for (poisoned sends,
    drained receives), and a gloo Work reports `is_completed()` only once waited for, so `bury()`
    never destroys it: each failure left one group (its sockets and threads) for the rest of the
    job. Call this only once the next generation has committed, so nobody still talks on the old
    groups: a short wait then finishes each call (closing the old group's pairs, where a call is
    still pending) and the destroy no longer blocks. It can cost tens of milliseconds per group
    (77 ms measured for a group of 4 with a receive and a send pending), which is why it is not
    done on the recovery path and only beyond `keep` groups."""
    bury()
    while len(_GRAVEYARD) > keep:
        world, pending = _GRAVEYARD.pop(0)
        for _, work, _ in pending:
            if not work.is_completed():
                with contextlib.suppress(RuntimeError):
                    work.wait(datetime.timedelta(milliseconds=5))
        pending.clear()
        del world
    return len(_GRAVEYARD)


WATCH_POLL_S = 0.1
"""How often a watched wait asks whether to give up (a store round trip or a few per ask)."""


def wait_watched(work: Any, timeout_s: float, watch: Callable[[], str | None]) -> None:
    """`work.wait(timeout_s)`, but give up (RuntimeError with `watch()`'s reason) as soon as `watch`
    answers one, e.g. "the peer has no heartbeat" or "the generation was given up".

    A hand-over's timeout must cover moving big layers (tens of seconds), so a peer hung (SIGSTOP)
    mid-transfer would hold us that long. gloo cannot cut a wait short: a shorter timeout breaks
    every pair of the group, and `abort()`/`shutdown()` of the group do not wake a pending wait
    (tried, torch 2.13). So the wait runs in a daemon thread (it releases the GIL) and we poll.
    An abandoned wait ends at its own timeout; its group is parked by `close()` meanwhile.
    """
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work.wait(datetime.timedelta(seconds=timeout_s))
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="watched-wait", daemon=True).start()
    while not done.wait(WATCH_POLL_S):
        reason = watch()
        if reason is not None:
            raise RuntimeError(reason)
    if failed:
        raise failed[0]

