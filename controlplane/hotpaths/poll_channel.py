"""The batched first step of the agents' command long-poll (`GET /api/v1/agents/commands/`) in the
ASGI entry point (`controlplane/asgi.py`), built as the heartbeat fast path
(`controlplane/hotpaths/heartbeat_channel.py`) is.

A plain poll (the exact shape the agent sends: `?version=<v>&wait=<s>` with 0 < wait <= the cap,
no body, its agent token, see `poll_claim`) skips the view's first step: the ASGI layer hashes the
token's key at once and drops it, and parks the claim in this worker's `WindowBatches`. Every
`window_s` (tunable `SPOTPIPE_POLL_BATCH_S`) the window's claims go to the pool together
(`first_steps`): ONE query reads their live agent tokens with their instances and jobs
(`fleet.heartbeats.agent_tokens_with_their_instances`, the heartbeat batch's read), from which
each agent's current version follows (`selectors.command_version`, the one formula). Then each
poll is either
- held (its version is current): the channel holds it as it holds one the view marked;
- answered (stale): the answers of the window's stale polls are read together
  (`services.agent_commands_many`) and sent with the view's headers.
The token is read in every batch, as the view reads it per request: a revoked or expired token is
never accepted after its revocation committed (nothing is cached). Everything else goes to the
view, which stays the one owner of the rules and of every refusal: another query string (no
`wait`, `wait=0`, a repeated or unknown parameter, a version with characters an issued version
never has), a body, a cookie, an unusual Accept, an unknown, revoked or expired token, a user
token, a token whose instance is gone or in another team, a host Django refuses, an http request
Django would redirect to https, a failed batch, and more than one poll per token per
`MIN_INTERVAL_S` in this worker (the API throttle, per agent, only counts what reaches the view).
docs/orchestration.md, "The agent command channel", has the measured cost."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from django.core.handlers.wsgi import WSGIRequest
from django.urls import reverse
from django.utils import timezone

from controlplane.accounts.authentication import hash_key
from controlplane.hotpaths import heartbeat_channel
from controlplane.hotpaths.agent_channel import render_answers
from controlplane.hotpaths.wsgi_bridge import WSGIResponse
from controlplane.orchestration import selectors
from controlplane.orchestration.api.serializers import COMMANDS_MAX_WAIT_S

URL = reverse("agent-commands")
# One token's polls take the batched path at most once in this time (an agent re-polls once an
# answer came: every `wait` seconds, or at a wake-up); more go to the view and its throttle.
MIN_INTERVAL_S = 0.1
# What the agent sends: the version of its last answer (`state:job:generation:status`, "" at
# first) and a wait in seconds. Anything else (spaces the view would trim, NULs, non-ASCII) is the view's.
_VERSION = re.compile(r"[A-Za-z0-9_:.\-]{0,200}")
_WAIT = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")


@dataclass(frozen=True)
class PollClaim:
    """A plain poll as the ASGI layer read it: the SHA-256 of its token's key (never the key), the
    version it holds and how long it may wait."""

    key_hash: str
    version: str
    wait: float


@dataclass(frozen=True)
class Hold:
    """The agent's version is current: hold the poll (what the view's hold mark says)."""

    instance_id: int
    job_id: int | None


@dataclass(frozen=True)
class Answer:
    """The agent's version is stale: the view's answer now (its JSON body and version)."""

    version: str
    body: bytes


def poll_claim(scope: dict[str, Any], body: bytes) -> tuple[PollClaim, WSGIRequest] | None:
    """The claim of a plain poll, with a request Django checked the host and scheme of; None for
    anything the view must answer."""
    if scope.get("method") != "GET" or scope.get("root_path") or scope.get("path") != URL or body:
        return None
    try:
        pairs = parse_qsl(scope.get("query_string", b"").decode("ascii"), keep_blank_values=True,
                          strict_parsing=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    query = dict(pairs)
    if len(pairs) != 2 or set(query) != {"version", "wait"}:
        return None
    version, wait_text = query["version"], query["wait"]
    if not _VERSION.fullmatch(version) or not _WAIT.fullmatch(wait_text):
        return None
    wait = float(wait_text)
    if not 0 < wait <= COMMANDS_MAX_WAIT_S:  # wait=0: the view answers at once
        return None
    plain = heartbeat_channel.agent_headers(scope)
    if plain is None:
        return None
    seen, key = plain
    if b"content-type" in seen or b"transfer-encoding" in seen or seen.get(b"content-length", b"0") != b"0":
        return None
    request = heartbeat_channel.checked_request(scope, body)
    if request is None:
        return None
    return PollClaim(key_hash=hash_key(key), version=version, wait=wait), request


def first_steps(claims: Sequence[PollClaim]) -> list[Hold | Answer | None]:
    """The view's first step (authentication, the agent's current version, hold or answer) for
    many polls at once (in a pool thread): one read of their tokens with their instances and jobs,
    one touch of the tokens whose `last_used_at` is due, and one batched answer read for the stale
    ones. None where the view must answer (see the module's docstring)."""
    from controlplane.accounts.authentication import last_used_due, token_expired
    from controlplane.accounts.models import ApiToken
    from controlplane.fleet.heartbeats import agent_tokens_with_their_instances

    now = timezone.now()
    rows = {row[0]: row for row in agent_tokens_with_their_instances(sorted({c.key_hash for c in claims}))}
    steps: list[Hold | Answer | None] = []
    stale: dict[int, list[int]] = {}  # instance id -> indexes of its stale polls
    used: dict[int, Any] = {}  # token id -> its last_used_at
    for index, claim in enumerate(claims):
        row = rows.get(claim.key_hash)
        if row is None:
            steps.append(None)
            continue
        _, token_id, team_id, instance_id, expires_at, last_used_at, instance_team_id, state, _, *job = row
        if token_expired(expires_at, now) or instance_team_id != team_id:
            steps.append(None)
            continue
        used[token_id] = last_used_at
        job_id, job_status, generation = job
        if selectors.command_version(state, job_id, generation, job_status) == claim.version:
            steps.append(Hold(instance_id, job_id))
        else:
            steps.append(None)  # filled in below
            stale.setdefault(instance_id, []).append(index)
    due = [pk for pk, last_used_at in used.items() if last_used_due(last_used_at, now)]
    if due:
        ApiToken.objects.filter(pk__in=due).update(last_used_at=now)
    if stale:
        for pk, (version, body) in render_answers(list(stale)).items():
            for index in stale[pk]:
                steps[index] = Answer(version, body)
    return steps


def response(request: WSGIRequest, body: bytes) -> WSGIResponse:
    """The view's 200 for this answer's body, with its headers."""
    return heartbeat_channel.response(request, body, URL)
