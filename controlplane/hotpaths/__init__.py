"""The web server's fast paths: the requests that come by the thousand (agents' command long-polls
and heartbeats, webhook bursts) answered without a thread or a full middleware stack each. Not a
Django app (no models): the entry points `controlplane/asgi.py` and `controlplane/wsgi.py` wire it;
the business rules stay in the apps' services, which these modules call. docs/orchestration.md,
"The agent command channel", says why this and not Django's async views.

- `wsgi_bridge`: run the WSGI application (Django, DRF) from the ASGI server, in a pool of its own
  (`thread_pools`: threads that close their database connections when the pool ends, and
  `in_request`, a call in such a thread with Django's per-request connection hygiene);
- `agent_channel`: where held command long-polls wait (one hub per worker, woken through Redis
  pub/sub: the services that write what a command is made of publish with
  `controlplane.common.agent_wake` on commit, as no app imports this package) and how a held poll
  is answered (the answers of the polls woken together read together);
- `window_batches`: requests of one worker handled together every window, used by
  `poll_channel` (the long-poll's first step: tokens and versions in one read) and
  `heartbeat_channel` (plain heartbeats in one UPDATE);
- `webhook_dispatch`: the inbound webhooks through a shorter middleware stack;
- `wsgi_environ`: no server environment in a request's environ;
- `request_limits`: the largest request body the server reads at all (the largest route's limit).
"""
