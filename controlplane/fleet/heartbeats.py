"""Agent heartbeats: the write behind `POST /api/v1/instances/{id}/heartbeat/`, for one heartbeat
(the view) and for many at once (the ASGI fast path, `controlplane/hotpaths/heartbeat_channel.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from controlplane.common.errors import Conflict
from controlplane.fleet.models import Instance
from controlplane.fleet.states import TERMINAL_STATES


def instance_heartbeat_record(
    *, instance: Instance, at: datetime | None = None, agent_address: str | None = None
) -> Instance:
    """Stamp `last_heartbeat_at` (it only moves forward) and, when given, the agent's address.

    One conditional UPDATE, no row lock: heartbeats are frequent and must not queue behind a
    reconfiguration that holds the job or instance. An ended instance answers Conflict (409), which
    tells its agent to stop rather than keep a dead node looking alive."""
    if instance.state in TERMINAL_STATES:
        raise Conflict(f"instance is {instance.state!r}; it takes no heartbeats", field="state")
    at = at or timezone.now()
    changes: dict[str, object] = {"last_heartbeat_at": at}
    if agent_address:
        changes["agent_address"] = agent_address[:200]
    updated = (
        Instance.objects.filter(pk=instance.pk)
        .exclude(state__in=TERMINAL_STATES)
        .filter(Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=at))
        .update(**changes)
    )
    if updated:
        for field, value in changes.items():
            setattr(instance, field, value)
    else:
        instance.refresh_from_db(fields=["state", "last_heartbeat_at", "agent_address"])
        if instance.state in TERMINAL_STATES:
            raise Conflict(f"instance is {instance.state!r}; it takes no heartbeats", field="state")
    return instance


@dataclass(frozen=True)
class HeartbeatClaim:
    """A heartbeat as the ASGI fast path read it: the SHA-256 of its token's key (never the key),
    the instance of its URL, and the address its body gave ("" for none)."""

    key_hash: str
    instance_id: int
    agent_address: str = ""


def instance_heartbeats_record_batch(claims: Sequence[HeartbeatClaim]) -> list[dict[str, Any] | None]:
    """The heartbeat view's work (authentication, scoping, `instance_heartbeat_record`) for many
    heartbeats at once, in a few queries whatever their number: one read of their tokens with
    their instances and jobs, ONE conditional UPDATE of `last_heartbeat_at` for all of them, and
    one touch of the tokens whose `last_used_at` is due.

    Returns, per claim, the view's result (what `HeartbeatResultSerializer` renders), or None
    where the answer is not the plain 200: an unknown, revoked or expired token, a user token,
    another instance's token, an ended instance, a new agent address. The caller hands those to
    the view, which stays the one owner of every refusal. The token is read here on every call:
    a revoked token is never accepted after its revocation committed."""
    from controlplane.accounts.authentication import last_used_due, token_expired
    from controlplane.accounts.models import ApiToken

    now = timezone.now()
    rows = {row[0]: row for row in agent_tokens_with_their_instances(sorted({c.key_hash for c in claims}))}
    accepted: dict[int, tuple] = {}  # instance id -> its token's row
    for claim in claims:
        row = rows.get(claim.key_hash)
        if row is None:
            continue
        _, _, team_id, instance_id, expires_at, _, instance_team_id, state, address, *_ = row
        if (token_expired(expires_at, now) or instance_id != claim.instance_id or instance_team_id != team_id
                or state in TERMINAL_STATES or claim.agent_address not in ("", address)):
            continue
        accepted[instance_id] = row
    if not accepted:
        return [None] * len(claims)
    at = timezone.now()
    updated = _stamp(list(accepted), at)
    stamps = dict.fromkeys(accepted, at)
    if updated != len(accepted):  # ended meanwhile, or a later stamp already there: as the view, re-read
        for pk, state, stamp in Instance.objects.filter(pk__in=list(accepted)).values_list(
                "pk", "state", "last_heartbeat_at"):
            if state in TERMINAL_STATES:
                del accepted[pk], stamps[pk]
            else:
                stamps[pk] = stamp
    due = [row[1] for row in accepted.values() if last_used_due(row[5], now)]
    if due:
        ApiToken.objects.filter(pk__in=due).update(last_used_at=now)
    results: list[dict[str, Any] | None] = []
    for claim in claims:
        row = accepted.get(claim.instance_id)
        if row is None or row[0] != claim.key_hash:
            results.append(None)
            continue
        job_id, job_status, generation = row[9:12]
        results.append({"instance": claim.instance_id, "state": row[7], "last_heartbeat_at": stamps[claim.instance_id],
                        "job": job_id, "job_status": job_status if job_id else None,
                        "current_generation": generation if job_id else None})
    return results


# The batch's two statements are plain SQL (tables named by the models): Django's query compiler
# costs several times the database round trip, and these run for every heartbeat window.


def _aware(value: datetime | None) -> datetime | None:
    """A datetime column read by a plain cursor, as the ORM returns it (SQLite's are naive UTC)."""
    return value if value is None or timezone.is_aware(value) else timezone.make_aware(value, UTC)


def agent_tokens_with_their_instances(key_hashes: list[str]) -> list[tuple]:
    """Live agent tokens with these hashes, each with its instance and the instance's job: (key_hash,
    token id, team, instance id, expires_at, last_used_at, the instance's team, state, agent_address,
    job id, job status, job current_generation), in ONE query (also the command poll's batched first step,
    `controlplane/hotpaths/poll_channel.py`)."""
    from controlplane.accounts.models import ApiToken, TokenKind
    from controlplane.fleet.models import job_model

    quote = connection.ops.quote_name
    token, instance, job = (quote(m._meta.db_table) for m in (ApiToken, Instance, job_model()))
    sql = (f"SELECT t.key_hash, t.id, t.team_id, t.instance_id, t.expires_at, t.last_used_at, i.team_id, i.state, "
           f"i.agent_address, i.job_id, j.status, j.current_generation FROM {token} t "
           f"JOIN {instance} i ON i.id = t.instance_id LEFT JOIN {job} j ON j.id = i.job_id "
           f"WHERE t.revoked_at IS NULL AND t.kind = %s AND t.key_hash IN ({', '.join(['%s'] * len(key_hashes))})")
    with connection.cursor() as cursor:
        cursor.execute(sql, [TokenKind.AGENT.value, *key_hashes])
        rows = cursor.fetchall()
    return [(*row[:4], _aware(row[4]), _aware(row[5]), *row[6:]) for row in rows]


def _stamp(instance_ids: list[int], at: datetime) -> int:
    """`instance_heartbeat_record`'s conditional UPDATE for all of these instances at once (only
    forward, never an ended one); returns how many rows moved."""
    adapt = connection.ops.adapt_datetimefield_value
    sql = (f"UPDATE {connection.ops.quote_name(Instance._meta.db_table)} SET last_heartbeat_at = %s "
           f"WHERE id IN ({', '.join(['%s'] * len(instance_ids))}) "
           f"AND state NOT IN ({', '.join(['%s'] * len(TERMINAL_STATES))}) "
           f"AND (last_heartbeat_at IS NULL OR last_heartbeat_at < %s)")
    with connection.cursor() as cursor:
        cursor.execute(sql, [adapt(at), *instance_ids, *(str(state) for state in TERMINAL_STATES), adapt(at)])
        return cursor.rowcount
