"""Wake-ups for agents' held command long-polls: "what the agent of this instance (or of every
instance of this job) should run may have changed".

The agent command version (`orchestration.selectors.agent_command_version`) is built from the
instance's state and its job's status and current generation; their writers
(`fleet.services.instance_transition`, the notice processor's batch, `jobs.services.job_set_status`,
`jobs.services.job_generation_publish`) call `commands_changed` inside their transaction. Once it
commits, one Redis message goes to CHANNEL, where every web worker's agent channel
(`controlplane/hotpaths/agent_channel.py`) listens. With no Redis (the embedded default) this
is a no-op and the channel's database poll is the only mechanism; a lost message costs at most that
poll's period, never a wrong answer (the answer is always read from the database)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

CHANNEL = "spotpipe:agent-commands"

_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        # Short timeouts: a hung Redis must not hold the transaction's caller (the poll catches up).
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    return _client


def encode(*, job_ids: Iterable[int] = (), instance_ids: Iterable[int] = ()) -> str:
    """The message: `j<id>` / `i<id>` words separated by spaces (e.g. `j12 i40 i41`)."""
    return " ".join([f"j{int(j)}" for j in job_ids] + [f"i{int(i)}" for i in instance_ids])


def decode(message: str | bytes) -> tuple[set[int], set[int]]:
    """(job ids, instance ids) of a message; unknown words are skipped."""
    if isinstance(message, bytes):
        message = message.decode("ascii", "replace")
    jobs, instances = set(), set()
    for word in message.split():
        kind, digits = word[:1], word[1:]
        if digits.isdigit():
            (jobs if kind == "j" else instances if kind == "i" else set()).add(int(digits))
    return jobs, instances


def publish(message: str) -> None:
    """Send `message` now; Redis down is logged (the agent channel's poll covers it)."""
    try:
        _redis().publish(CHANNEL, message)
    except Exception:
        logger.warning("could not publish agent wake-up %r; held long-polls see it at their next poll", message)


def commands_changed(*, job_ids: Iterable[int] = (), instance_ids: Iterable[int] = ()) -> None:
    """Wake the held long-polls of these jobs' and instances' agents once the current transaction
    commits (at once outside one). No-op without REDIS_URL."""
    if not getattr(settings, "REDIS_URL", ""):
        return
    message = encode(job_ids=[j for j in job_ids if j is not None], instance_ids=instance_ids)
    if message:
        transaction.on_commit(lambda: publish(message))
