"""Where held agent command long-polls wait and how they are answered, one hub per web worker
process (asyncio).

A held poll costs a future here, not a thread: the ASGI entry point (`controlplane/asgi.py`) answers
at once when the agent's version is stale (through the usual Django view, or for a plain poll its
batched first step, `poll_channel.py`), else holds the request (`hold_poll`) in `CommandWaiters.wait`
until one of:
- a Redis message on `common.agent_wake.CHANNEL` names its instance or its job (published on commit
  by the writers of what the version is made of): the prompt path, production stack;
- the hub's database poll, ONE query for every poll held in this process
  (`selectors.agent_command_versions`), sees its version change: the fallback for a lost message
  (every `slow_poll_s`) and the only mechanism without Redis (every `fast_poll_s`);
- its time is up.
The answer is then read from the database (`AnswerReads`: the polls woken together read together,
`services.agent_commands_many`, rendered as the view renders it), so a wake-up never decides what
an agent runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from controlplane.common.agent_wake import CHANNEL, decode
from controlplane.hotpaths.thread_pools import in_request
from controlplane.orchestration import services

logger = logging.getLogger(__name__)

# A held poll is answered after `wait` x (1 - up to this share) when nothing changed.
HOLD_JITTER = 0.25


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


def render_answers(instance_ids: list[int]) -> dict[int, tuple[str, bytes]]:
    """The view's answer (version, JSON body) of each of these instances, read together."""
    from rest_framework.settings import api_settings

    renderer = api_settings.DEFAULT_RENDERER_CLASSES[0]()
    answers = services.agent_commands_many(instance_ids=instance_ids)
    return {pk: (answer["version"], renderer.render(answer)) for pk, answer in answers.items()}


class AnswerReads:
    """Coalesces the answer reads that held polls ask for within `window_s` into one call in the
    pool: a new generation wakes every agent of its job at once, and a few queries for all of them
    cost less than a few per agent (`services.agent_commands_many`)."""

    def __init__(self, executor: Executor, window_s: float = 0.002) -> None:
        self.executor = executor
        self.window_s = window_s
        self.pending: dict[int, list[asyncio.Future]] = {}
        self._flushes: set[asyncio.Task] = set()  # referenced until done (the loop keeps weak ones)

    def _start_flush(self) -> None:
        task = asyncio.ensure_future(self._flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def answer(self, instance_id: int) -> tuple[str, bytes]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.pending:
            loop.call_later(self.window_s, self._start_flush)
        self.pending.setdefault(instance_id, []).append(future)
        return await future

    async def _flush(self) -> None:
        batch, self.pending = self.pending, {}
        try:
            rendered = await asyncio.get_running_loop().run_in_executor(
                self.executor, in_request, render_answers, list(batch))
        except Exception as exc:
            rendered, error = {}, exc
        else:
            error = None
        for pk, futures in batch.items():
            for future in futures:
                if future.done():
                    continue
                if pk in rendered:
                    future.set_result(rendered[pk])
                else:
                    future.set_exception(error or LookupError(f"instance {pk} does not exist"))


async def _disconnected(receive: Callable) -> None:
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(1.0)  # a server that sends something else: look again, without spinning


async def hold_poll(receive: Callable, *, waiters: CommandWaiters, answers: AnswerReads, started: float,
                    version: str, wait: float, instance_id: int, job_id: int | None) -> bytes | None:
    """Hold a poll whose version is current until a wake-up changes it or its time is up; the
    answer's body then, or None when the agent hung up (`receive`: the request's ASGI channel)."""
    # Up to `wait`, less a random part: polls that started together (a restart, a mass
    # enrolment) do not all come back together for ever.
    deadline = started + wait * random.uniform(1.0 - HOLD_JITTER, 1.0)
    read_at = started
    gone = asyncio.create_task(_disconnected(receive))
    try:
        while True:
            held = asyncio.create_task(waiters.wait(
                instance_id=instance_id, job_id=job_id, version=version,
                timeout_s=deadline - time.monotonic(), read_at=read_at))
            done, _ = await asyncio.wait({held, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone in done:
                held.cancel()
                return None  # the agent hung up: nobody to answer
            read_at = time.monotonic()
            new_version, rendered = await answers.answer(instance_id)
            # A wake-up that changed nothing for this agent (another field of its job): hold on.
            if not held.result() or new_version != version or time.monotonic() >= deadline:
                return rendered
    finally:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await gone
