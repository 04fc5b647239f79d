"""Where held agent command long-polls wait, one hub per web worker process (asyncio).

A held poll costs a future here, not a thread: the ASGI entry point (`controlplane/asgi.py`) answers
at once when the agent's version is stale (through the usual Django view, or for a plain poll its
batched first step, `poll_channel.py`), else parks the request in `CommandWaiters.wait` until one of:
- a Redis message on `common.agent_wake.CHANNEL` names its instance or its job (published on commit
  by the writers of what the version is made of): the prompt path, production stack;
- the hub's database poll, ONE query for every poll held in this process
  (`selectors.agent_command_versions`), sees its version change: the fallback for a lost message
  (every `slow_poll_s`) and the only mechanism without Redis (every `fast_poll_s`);
- its time is up.
The caller then reads the answer from the database, so a wake-up never decides what an agent runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from controlplane.common.agent_wake import CHANNEL, decode

logger = logging.getLogger(__name__)



@dataclass(eq=False)
class _Waiter:
    instance_id: int
    job_id: int | None
    version: str
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class CommandWaiters:
    """Held long-polls of one process, woken by Redis pub/sub and a batched database poll.

    `versions_of(instance_ids) -> {instance_id: version}` is the batched read (called in `executor`);
    `redis_url` empty means no subscriber."""

    def __init__(self, *, versions_of: Callable[[list[int]], dict[int, str]], executor: Executor,
                 redis_url: str = "", fast_poll_s: float, slow_poll_s: float) -> None:
        self.versions_of = versions_of
        self.executor = executor
        self.redis_url = redis_url
        self.fast_poll_s = fast_poll_s
        self.slow_poll_s = slow_poll_s
        self.subscribed = False
        self._by_instance: dict[int, set[_Waiter]] = {}
        self._by_job: dict[int, set[_Waiter]] = {}
        # When each job / instance was last named by a wake-up (monotonic): a poll that read its
        # version just before a message and registered just after it is woken at once.
        self._last_wake: dict[tuple[str, int], float] = {}
        self._have_waiters: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def held(self) -> int:
        return sum(len(s) for s in self._by_instance.values())

    def _start(self) -> None:
        if self._tasks:
            return
        self._have_waiters = asyncio.Event()
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="agent-commands-poll"))
        if self.redis_url:
            self._tasks.append(asyncio.create_task(self._subscribe_loop(), name="agent-commands-redis"))

    async def wait(self, *, instance_id: int, job_id: int | None, version: str, timeout_s: float,
                   read_at: float | None = None) -> bool:
        """Hold until a wake-up concerns this instance (True) or `timeout_s` passes (False).
        `read_at` (time.monotonic()) is when the caller read `version`: a wake-up since then
        returns at once."""
        self._start()
        if read_at is not None and max(self._last_wake.get(("i", instance_id), -1.0),
                                       self._last_wake.get(("j", job_id), -1.0)) >= read_at:
            return True
        waiter = _Waiter(instance_id, job_id, version)
        self._by_instance.setdefault(instance_id, set()).add(waiter)
        if job_id is not None:
            self._by_job.setdefault(job_id, set()).add(waiter)
        self._have_waiters.set()
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await waiter.woken.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._discard(waiter)

    def _discard(self, waiter: _Waiter) -> None:
        for index, key in ((self._by_instance, waiter.instance_id), (self._by_job, waiter.job_id)):
            group = index.get(key)
            if group is not None:
                group.discard(waiter)
                if not group:
                    del index[key]
        if not self._by_instance and self._have_waiters is not None:
            self._have_waiters.clear()

    def wake(self, *, job_ids: set[int] = frozenset(), instance_ids: set[int] = frozenset()) -> int:
        """Release the held polls of these jobs and instances; returns how many."""
        woken = 0
        now = time.monotonic()
        if len(self._last_wake) > 100_000:  # only recent entries matter (a poll's read -> register)
            self._last_wake = {k: t for k, t in self._last_wake.items() if now - t < 60}
        for kind, index, keys in (("j", self._by_job, job_ids), ("i", self._by_instance, instance_ids)):
            for key in keys:
                self._last_wake[(kind, key)] = now
                for waiter in index.get(key, ()):
                    if not waiter.woken.is_set():
                        waiter.woken.set()
                        woken += 1
        return woken

    async def _poll_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._have_waiters.wait()
            await asyncio.sleep(self.slow_poll_s if self.subscribed else self.fast_poll_s)
            held = list(self._by_instance)
            if not held:
                continue
            try:
                versions = await loop.run_in_executor(self.executor, self.versions_of, held)
            except Exception:
                logger.exception("agent command poll failed; retrying")
                continue
            changed = {
                w.instance_id for i in held for w in self._by_instance.get(i, ())
                if versions.get(i, "gone") != w.version
            }
            self.wake(instance_ids=changed)

    async def _subscribe_loop(self) -> None:
        import redis.asyncio as aioredis

        while True:
            client = aioredis.Redis.from_url(self.redis_url, socket_connect_timeout=1)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    self.subscribed = True
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            jobs, instances = decode(message["data"])
                            self.wake(job_ids=jobs, instance_ids=instances)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the poll takes over at its fast period
                logger.warning("agent command channel lost Redis (%s); polling the database meanwhile", exc)
            finally:
                self.subscribed = False
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
