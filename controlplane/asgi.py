"""ASGI entry point of the production web server (`granian --interface asgi controlplane.asgi:application`).

Every request but one goes to the WSGI application (`controlplane.wsgi.application`: Django, DRF,
the webhook fast path) in a pool of `SPOTPIPE_WEB_THREADS` threads per worker (default 16). The
agents' command long-poll (`GET /api/v1/agents/commands/`) is answered in two short steps in the
pool with the hold between them on the event loop, so a thousand held polls cost no thread:
1. the usual view (auth, validation, version check) with the hold switched off: a stale `version`,
   no `wait`, or an error is answered by it at once; a current version only gets a "hold" mark
   (no answer is built: a thousand agents re-poll every 20 s);
2. the request then waits in this worker's `CommandWaiters` (Redis pub/sub wake-up, batched
   database poll as fallback) for at most `wait` seconds (less up to 25%, at random), then the
   answer is read from the database
   (`services.agent_commands_many` for all the polls woken together, rendered as the view renders
   it) with the first step's headers.
A plain poll (the exact shape the agent sends) skips the view in step 1: its first step is taken
with those of its window in ONE read of their tokens and versions
(`controlplane/hotpaths/poll_channel.py`); anything unusual, and every refusal, is the view's.
The agents' plain heartbeats (`POST /api/v1/instances/{id}/heartbeat/`) are answered by the
heartbeat fast path (`controlplane/hotpaths/heartbeat_channel.py`): the heartbeats of 0.1 s are
written in one UPDATE and answered together, and anything else goes to the view.
docs/orchestration.md, "The agent command channel", says why this and not Django's async views."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.urls import reverse  # noqa: E402

from controlplane.common.heap import freeze_startup_heap  # noqa: E402
from controlplane.hotpaths import heartbeat_channel, poll_channel  # noqa: E402
from controlplane.hotpaths.agent_channel import AnswerReads, CommandWaiters, hold_poll  # noqa: E402
from controlplane.hotpaths.request_limits import request_body_ceiling  # noqa: E402
from controlplane.hotpaths.thread_pools import DatabaseThreadPool, in_request  # noqa: E402
from controlplane.hotpaths.window_batches import WindowBatches  # noqa: E402
from controlplane.hotpaths.wsgi_bridge import WSGIBridge, WSGIResponse, send_response  # noqa: E402
from controlplane.orchestration import selectors  # noqa: E402
from controlplane.orchestration.api.serializers import COMMANDS_MAX_WAIT_S  # noqa: E402
from controlplane.orchestration.api.views import HELD_BY_AGENT_CHANNEL, HOLD_HEADER  # noqa: E402
from controlplane.tunables import tunable  # noqa: E402
from controlplane.wsgi import application as wsgi_application  # noqa: E402

logger = logging.getLogger(__name__)

# Threads per worker for the WSGI application (what granian's `--blocking-threads` was).
WEB_THREADS = int(tunable("SPOTPIPE_WEB_THREADS"))
# Threads per worker for the agent channel's reads (answers after a wake-up, the batched poll),
# apart from the web threads: a wake-up of a thousand agents does not queue ahead of webhooks.
AGENT_THREADS = int(tunable("SPOTPIPE_AGENT_THREADS"))
COMMANDS_PATH = reverse("agent-commands")


def _query(scope: dict[str, Any]) -> tuple[str, float]:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    try:
        wait = min(COMMANDS_MAX_WAIT_S, max(0.0, float(query.get("wait", ["0"])[0])))
    except ValueError:
        wait = 0.0
    return query.get("version", [""])[0], wait


class ControlPlane:
    """The ASGI application: the agent command channel, and the WSGI application for the rest."""

    def __init__(self, wsgi: Callable, *, web_threads: int = WEB_THREADS, agent_threads: int = AGENT_THREADS,
                 redis_url: str | None = None, fast_poll_s: float | None = None,
                 slow_poll_s: float | None = None, heartbeat_batch_s: float | None = None,
                 poll_batch_s: float | None = None) -> None:
        self.bridge = WSGIBridge(wsgi, threads=web_threads, max_body_bytes=request_body_ceiling())
        self.agent_executor = DatabaseThreadPool(max_workers=agent_threads, thread_name_prefix="agent-channel")
        self.answers = AnswerReads(self.agent_executor)
        self.waiters = CommandWaiters(
            versions_of=lambda ids: in_request(selectors.agent_command_versions, ids),
            executor=self.agent_executor,
            redis_url=settings.REDIS_URL if redis_url is None else redis_url,
            fast_poll_s=tunable("SPOTPIPE_AGENT_POLL_S") if fast_poll_s is None else fast_poll_s,
            slow_poll_s=tunable("SPOTPIPE_AGENT_POLL_REDIS_S") if slow_poll_s is None else slow_poll_s,
        )
        self.heartbeats = WindowBatches(
            record_batch=lambda claims: in_request(heartbeat_channel.record_and_render, claims),
            executor=self.agent_executor,
            window_s=tunable("SPOTPIPE_HEARTBEAT_BATCH_S") if heartbeat_batch_s is None else heartbeat_batch_s,
            min_interval_s=heartbeat_channel.MIN_INTERVAL_S,
        )
        self.polls = WindowBatches(
            record_batch=lambda claims: in_request(poll_channel.first_steps, claims),
            executor=self.agent_executor,
            window_s=tunable("SPOTPIPE_POLL_BATCH_S") if poll_batch_s is None else poll_batch_s,
            min_interval_s=poll_channel.MIN_INTERVAL_S, what="command poll",
        )

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] == COMMANDS_PATH and scope["method"] == "GET":
            await self.commands(scope, receive, send)
        elif scope["type"] == "http" and (instance_id := heartbeat_channel.heartbeat_instance(scope)) is not None:
            await self.heartbeat(scope, receive, send, instance_id)
        elif scope["type"] == "http":
            await self.bridge(scope, receive, send)

    def close_pools(self) -> None:
        """Shut both thread pools down, their threads' database connections closed (the batches and
        waiters closed first: they submit to the agent pool)."""
        self.agent_executor.shutdown()
        self.bridge.executor.shutdown()

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.heartbeats.close()
                await self.polls.close()
                await self.waiters.close()
                await asyncio.get_running_loop().run_in_executor(None, self.close_pools)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def heartbeat(self, scope: dict[str, Any], receive: Callable, send: Callable, instance_id: int) -> None:
        """A plain heartbeat is answered with its window's batch; anything else by the view."""
        body = await self.bridge.receive_body(scope, receive, send)
        if body is None:
            return
        try:
            content = body.read(heartbeat_channel.MAX_BODY + 1)
            try:
                claimed = heartbeat_channel.heartbeat_claim(scope, content, instance_id)
            except Exception:  # a request it cannot read is the view's to answer, never a 500 here
                logger.exception("heartbeat fast path could not read a request; the view answers it")
                claimed = None
            if claimed is not None and self.heartbeats.admit(instance_id):
                claim, request = claimed
                answer = await self.heartbeats.record(claim)
                if answer is not None:
                    await send_response(send, heartbeat_channel.response(request, answer))
                    return
            body.seek(0)
            response = await self.bridge.call(scope, body)
        finally:
            body.close()
        await send_response(send, response, executor=self.bridge.executor)

    async def _first_step(self, scope: dict[str, Any], body: Any) -> tuple[Any, Any] | None:
        """The batched first step of a plain poll (`poll_channel.Hold` or `Answer`, with the request
        its answer's headers are made for); None: the view takes it."""
        try:
            claimed = poll_channel.poll_claim(scope, body.read(1))
        except Exception:  # a request it cannot read is the view's to answer, never a 500 here
            logger.exception("command poll fast path could not read a request; the view answers it")
            return None
        if claimed is None or not self.polls.admit(claimed[0].key_hash):
            return None
        claim, request = claimed
        step = await self.polls.record(claim)
        return None if step is None else (step, request)

    async def commands(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        started = time.monotonic()
        body = await self.bridge.receive_body(scope, receive, send)
        if body is None:
            return
        try:
            batched = await self._first_step(scope, body)
            if batched is None:
                body.seek(0)
                # In the agent channel's pool, not the views': a herd of agents re-polling at once
                # queues there, not ahead of webhooks and the dashboard.
                first = await self.bridge.call(scope, body, extra={HELD_BY_AGENT_CHANNEL: True},
                                               executor=self.agent_executor)
        finally:
            body.close()
        version, wait = _query(scope)
        if batched is not None:
            step, request = batched
            if isinstance(step, poll_channel.Answer):
                await send_response(send, poll_channel.response(request, step.body))
                return
            rendered = await hold_poll(receive, waiters=self.waiters, answers=self.answers, started=started,
                                       version=version, wait=wait, instance_id=step.instance_id, job_id=step.job_id)
            if rendered is not None:
                await send_response(send, poll_channel.response(request, rendered))
            return
        hold = dict(first.headers).get(HOLD_HEADER.lower().encode())
        if first.status != 204 or hold is None:
            await send_response(send, first)  # a stale version, no wait, or an error: the view's answer
            return
        instance_id, job_text = hold.decode().split()
        rendered = await hold_poll(receive, waiters=self.waiters, answers=self.answers, started=started,
                                   version=version, wait=wait, instance_id=int(instance_id),
                                   job_id=int(job_text) if job_text.isdigit() else None)
        if rendered is None:
            return
        dropped = (b"content-length", b"content-type", HOLD_HEADER.lower().encode())
        headers = [(k, v) for k, v in first.headers if k not in dropped]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(rendered)).encode())]
        await send_response(send, WSGIResponse(200, headers, rendered))


application = ControlPlane(wsgi_application)

# Start-up objects out of the collector's full passes (controlplane/common/heap.py): a full
# collection walked all of them inside whichever request triggered it.
freeze_startup_heap()
