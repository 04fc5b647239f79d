"""Requests of one web worker handled together every `window_s`: the ASGI entry point's batched
paths (heartbeats, `controlplane/hotpaths/heartbeat_channel.py`; the command poll's first step,
`controlplane/hotpaths/poll_channel.py`). A claim waits for its window; the window's claims go
to the pool in one call, whose result per claim is the answer, or None: the view answers it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from typing import Any

logger = logging.getLogger(__name__)


class WindowBatches:
    """Claims of one worker, handled and answered together every `window_s`.

    `record_batch(claims) -> [result or None]` runs in `executor` (with Django's connection
    hygiene: the caller wraps it). `admit(key)` lets one claim per key through per `min_interval_s`
    (a flood from one principal goes to the view and its throttle, which only counts what reaches it)."""

    def __init__(self, *, record_batch: Callable[[list[Any]], list[Any]], executor: Executor | None,
                 window_s: float, max_batch: int = 500, min_interval_s: float = 0.1, what: str = "heartbeat") -> None:
        self.record_batch = record_batch
        self.executor = executor
        self.window_s = window_s
        self.max_batch = max_batch
        self.min_interval_s = min_interval_s
        self.what = what  # for the log
        self.pending: list[tuple[Any, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task] = set()  # referenced until done (the loop keeps weak ones)
        self._last: dict[Hashable, float] = {}  # key -> its last admitted claim (monotonic)
        self.answered = 0  # claims the batched path answered
        self.handed_over = 0  # claims it gave to the view
        self.flushes = 0

    def admit(self, key: Hashable) -> bool:
        """Whether this key's claim may take the batched path now (at most one per `min_interval_s`)."""
        now = time.monotonic()
        if now - self._last.get(key, -self.min_interval_s) < self.min_interval_s:
            return False
        if len(self._last) > 100_000:  # only recent entries matter
            self._last = {k: t for k, t in self._last.items() if now - t < self.min_interval_s}
        self._last[key] = now
        return True

    async def record(self, claim: Any) -> Any:
        """The claim's result once its batch is handled; None: the view answers."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((claim, future))
        if len(self.pending) >= self.max_batch:
            self._flush_now()
        elif self._timer is None:
            self._timer = loop.call_later(self.window_s, self._flush_now)
        result = await future
        if result is None:
            self.handed_over += 1
        else:
            self.answered += 1
        return result

    def _flush_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self.pending = self.pending, []
        if batch:
            task = asyncio.ensure_future(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        self.flushes += 1
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.record_batch, [claim for claim, _ in batch])
        except Exception:
            logger.exception("%s batch of %d failed; the view answers them", self.what, len(batch))
            results = [None] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def close(self) -> None:
        """Handle and answer what is pending now (a clean shutdown loses no claim)."""
        self._flush_now()
        await asyncio.gather(*list(self._flushes), return_exceptions=True)
