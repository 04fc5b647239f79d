"""CPU per agent request, in process (no server, no client, one thread), on the database the last
`python -m bench fleet` left (BENCH_FLEET_DB, default h53): what 1,024 agents cost the web tier
whatever the server. `python -m bench._fleet_costs [--n 300] [--seed AGENTS]` prints ms of CPU per
request (`--seed`: first create that database and a fleet of AGENTS running nodes, as `bench fleet`
does, without running it):
- a heartbeat (`POST /api/v1/instances/{id}/heartbeat/`, the fleet app's view), through the site's
  middleware and through the webhooks' short stack (is it the middleware or the view?);
- the same heartbeat through the ASGI entry point's fast path (controlplane/hotpaths/heartbeat_channel.py)
  when 1, 10 or 32 agents heartbeat within one batch window (1,024 agents every 10 s: about 10 a
  window of 0.1 s), all of its CPU counted (event loop and pool thread: this process's CPU time);
- a command poll's first step under the agent channel, version current (the view's hold mark);
- the same first step through the ASGI entry point when 1, 10 or 32 agents poll within one batch
  window: by the batched first step (controlplane/hotpaths/poll_channel.py) and by the view,
  from the request to the poll held (and its hang-up), all of its CPU counted as for heartbeats;
- one answer of a batch of 32 (`services.agent_commands_many` + rendering), what a wake-up costs;
- a webhook notice (EventBridge, stored; no Celery hand-off);
- a database round trip (`SELECT 1`): how much of the above is the database client."""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Awaitable, Callable

from bench import fleet


def _call(app, method: str, path: str, *, query: str = "", headers: dict[str, str], body: bytes = b"",
          extra: dict | None = None) -> int:
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "SERVER_NAME": "127.0.0.1",
               "SERVER_PORT": "8000", "REMOTE_ADDR": "127.0.0.1", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.input": io.BytesIO(body), "wsgi.errors": io.StringIO(), "wsgi.url_scheme": "http",
               "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
               "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json", **(extra or {})}
    for k, v in headers.items():
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    status = []
    result = app(environ, lambda s, h, e=None: status.append(int(s[:3])))
    b"".join(result)
    result.close()
    return status[0]


def _cpu_ms(fn, n: int) -> float:
    fn()  # warm
    started = time.process_time()
    for _ in range(n):
        fn()
    return round((time.process_time() - started) / n * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="create the database with this many agents first")
    args = parser.parse_args()
    n = args.n
    import os

    if args.seed:
        from bench.report import Progress

        fleet._prepare(Progress())
        fleet.wh._seed(fleet.WEBHOOK_TARGETS)
        fleet._seed_fleet(args.seed, 32, Progress())

    os.environ.update({k: v for k, v in fleet._env(SPOTPIPE_NOTICE_HANDOFF="none").items()
                       if k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_", "DEBUG", "SPOTPIPE_"))})
    import django

    django.setup()
    from controlplane.accounts.models import Team, TokenKind
    from controlplane.accounts.services import api_token_create
    from controlplane.fleet.models import Instance
    from controlplane.hotpaths.webhook_dispatch import WebhookWSGIHandler
    from controlplane.orchestration import selectors, services
    from controlplane.orchestration.api.views import HELD_BY_AGENT_CHANNEL
    from controlplane.webhooks.credentials import credential_create
    from controlplane.wsgi import application

    node = Instance.objects.filter(team__slug=fleet.FLEET_TEAM, state="running").order_by("id").first()
    _, key = api_token_create(team=node.team, kind=TokenKind.AGENT, instance=node, name="costs")
    auth = {"Authorization": f"Token {key}"}
    version, _ = selectors.agent_command_version(instance_id=node.pk)
    job_ids = list(Instance.objects.filter(job_id=node.job_id).values_list("pk", flat=True))[:32]
    team = Team.objects.get(slug="bench-team")
    secret = "sp_wh_costs"
    credential_create(team=team, source="aws_eventbridge", scheme="api_key", header_name="x-api-key", secret=secret)
    counter = iter(range(10**9))

    def webhook() -> int:
        event = {"version": "0", "id": f"costs-{next(counter)}", "source": "aws.ec2", "account": "123456789012",
                 "detail-type": "EC2 Instance Rebalance Recommendation", "time": "2026-11-20T14:02:00Z",
                 "region": "us-east-1", "resources": [], "detail": {"instance-id": "i-00000000000000001"}}
        return _call(application, "POST", "/api/v1/webhooks/aws/eventbridge/bench-team/",
                     headers={"x-api-key": secret}, body=json.dumps(event).encode())

    from rest_framework.renderers import JSONRenderer

    def batch() -> None:
        for answer in services.agent_commands_many(instance_ids=job_ids).values():
            JSONRenderer().render(answer)

    from django.db import connection

    cursor = connection.cursor()
    short_stack = WebhookWSGIHandler()
    figures = {
        "heartbeat_ms_cpu": _cpu_ms(lambda: _call(application, "POST", f"/api/v1/instances/{node.pk}/heartbeat/",
                                                  headers=auth, body=b"{}"), n),
        "heartbeat_through_the_short_middleware_stack_ms_cpu": _cpu_ms(lambda: _call(
            short_stack, "POST", f"/api/v1/instances/{node.pk}/heartbeat/", headers=auth, body=b"{}"), n),
        "command_poll_first_step_hold_mark_ms_cpu": _cpu_ms(lambda: _call(
            application, "GET", "/api/v1/agents/commands/", query=f"version={version}&wait=20", headers=auth,
            extra={HELD_BY_AGENT_CHANNEL: True}), n),
        "command_poll_full_answer_ms_cpu": _cpu_ms(lambda: _call(
            application, "GET", "/api/v1/agents/commands/", query="version=&wait=0", headers=auth), n),
        "batched_answer_per_agent_ms_cpu (32 a batch)": round(_cpu_ms(batch, max(1, n // 32)) / len(job_ids), 3),
        "webhook_notice_ms_cpu": _cpu_ms(webhook, n),
        "database_round_trip_select_1_ms_cpu": _cpu_ms(lambda: (cursor.execute("SELECT 1"), cursor.fetchall()), n),
    }
    for agents in (1, 10, 32):
        figures[f"heartbeat_fast_path_ms_cpu ({agents} a window)"] = _fast_path_ms(node.team, agents, n)
    for agents in (1, 10, 32):
        for batched in (True, False):
            name = "batched" if batched else "by_the_view_through_asgi"
            figures[f"command_poll_first_step_held_{name}_ms_cpu ({agents} a window)"] = _poll_held_ms(
                node.team, agents, n, batched=batched)
    print(json.dumps(figures, indent=1))


def _cpu_ms_per_request(window: Callable[[], Awaitable[None]], *, rounds: int, per_window: int) -> float:
    """ms of this process's CPU per request: one window to warm up, then `rounds` windows of
    `per_window` requests each (`window` is the coroutine function of one)."""
    import asyncio

    async def run() -> float:
        await window()  # warm
        started = time.process_time()
        for _ in range(rounds):
            await window()
        return (time.process_time() - started) / (rounds * per_window) * 1000

    return asyncio.run(run())


def _fast_path_ms(team, agents: int, n: int) -> float:
    """CPU per heartbeat through the ASGI app's fast path, `agents` agents heartbeating in each
    window of 0.1 s (at least `n` heartbeats in all)."""
    import asyncio

    from controlplane.accounts.models import TokenKind
    from controlplane.accounts.services import api_token_create
    from controlplane.asgi import ControlPlane
    from controlplane.fleet.models import Instance
    from controlplane.hotpaths.heartbeat_channel import MIN_INTERVAL_S
    from controlplane.wsgi import application

    nodes = list(Instance.objects.filter(team=team, state="running").order_by("id")[:agents])
    keys = {node.pk: api_token_create(team=team, kind=TokenKind.AGENT, instance=node, name="costs")[1]
            for node in nodes}
    app = ControlPlane(application, redis_url="", heartbeat_batch_s=MIN_INTERVAL_S)

    async def beat(pk: int) -> int:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": f"/api/v1/instances/{pk}/heartbeat/", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
                 "headers": [(b"authorization", f"Token {keys[pk]}".encode()), (b"accept", b"*/*"),
                             (b"content-type", b"application/json"), (b"content-length", b"2")]}
        sent = []
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive():
            return messages.pop(0)

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return sent[0]["status"]

    async def window() -> None:
        statuses = await asyncio.gather(*(beat(pk) for pk in keys), asyncio.sleep(MIN_INTERVAL_S))
        assert statuses[:-1] == [200] * len(keys), statuses

    ms = _cpu_ms_per_request(window, rounds=max(3, n // agents), per_window=agents)
    app.close_pools()
    assert app.heartbeats.handed_over == 0, "a heartbeat went to the view: not the fast path's cost"
    return round(ms, 3)


def _poll_held_ms(team, agents: int, n: int, *, batched: bool) -> float:
    """CPU per command poll through the ASGI app, version current, from the request until it is
    held (then the agent hangs up), `agents` agents polling in each window of 0.1 s (at least `n`
    polls in all); the first step by the batched path or (`batched` False) by the view."""
    import asyncio

    from controlplane.accounts.models import TokenKind
    from controlplane.accounts.services import api_token_create
    from controlplane.asgi import ControlPlane
    from controlplane.fleet.models import Instance
    from controlplane.hotpaths.poll_channel import MIN_INTERVAL_S
    from controlplane.orchestration import selectors
    from controlplane.wsgi import application

    nodes = list(Instance.objects.filter(team=team, state="running").order_by("id")[:agents])
    keys = {node.pk: api_token_create(team=team, kind=TokenKind.AGENT, instance=node, name="costs")[1]
            for node in nodes}
    versions = selectors.agent_command_versions(list(keys))
    # No Redis, no database poll during the run: nothing but the first steps and the holds.
    app = ControlPlane(application, redis_url="", fast_poll_s=3600, slow_poll_s=3600, poll_batch_s=MIN_INTERVAL_S)
    if not batched:
        app.polls.admit = lambda key: False
    holding = {"polls": 0, "all": asyncio.Event()}  # a window's polls that reached their hold
    hold = app.waiters.wait

    async def counted(**kwargs) -> bool:
        holding["polls"] += 1
        if holding["polls"] == len(keys):
            holding["all"].set()
        return await hold(**kwargs)

    app.waiters.wait = counted

    async def poll(pk: int, hang_up: asyncio.Event) -> None:
        query = f"version={versions[pk]}&wait=20".replace(":", "%3A")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": "/api/v1/agents/commands/", "query_string": query.encode(),
                 "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
                 "headers": [(b"authorization", f"Token {keys[pk]}".encode()), (b"accept", b"*/*")]}
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            await hang_up.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            raise AssertionError(f"a poll on the current version was answered: {message}")

        await app(scope, receive, send)

    async def window() -> None:
        pause = asyncio.create_task(asyncio.sleep(MIN_INTERVAL_S * 1.05))  # past the flood guard's interval
        hang_up = asyncio.Event()
        holding["polls"], holding["all"] = 0, asyncio.Event()
        polls = [asyncio.create_task(poll(pk, hang_up)) for pk in keys]
        await holding["all"].wait()
        hang_up.set()
        await asyncio.gather(*polls, pause)

    ms = _cpu_ms_per_request(window, rounds=max(3, n // agents), per_window=agents)
    app.close_pools()
    if batched:
        assert app.polls.handed_over == 0 and app.polls.answered > 0, "a poll went to the view"
    else:
        assert app.polls.answered == 0
    return round(ms, 3)


if __name__ == "__main__":
    main()
