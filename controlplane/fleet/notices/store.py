"""Storing notices: one idempotent multi-row insert per request, handed to workers on commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from controlplane.fleet.models import InterruptionNotice, NoticeStatus
from controlplane.fleet.notices.handoff import notices_handoff
from controlplane.tunables import tunable

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class NoticeDraft:
    """A validated notice, not yet stored. `dedup_key` makes the insert idempotent."""

    team_id: int | None
    source: str
    kind: str
    action: str = ""
    dedup_key: str
    cloud_event_id: str = ""
    provider_instance_id: str
    event_time: datetime | None = None
    deadline: datetime | None = None
    payload: dict = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class StoreResult:
    """Which drafts were new (id assigned) and which were already stored (duplicates)."""

    stored: dict[str, int]
    duplicates: list[str]


# Columns the insert fills from each draft; the other columns get their defaults as literals in the
# SQL (status "received", no attempts, ...), so a row costs 11 parameters and no model instance.
_DRAFT_COLUMNS = (
    "team_id",
    "source",
    "kind",
    "action",
    "dedup_key",
    "cloud_event_id",
    "provider_instance_id",
    "event_time",
    "deadline",
    "received_at",
    "payload",
)
_DEFAULT_COLUMNS = (
    ("instance_id", "NULL"),
    ("unknown_instance", "%s"),
    ("status", "%s"),
    ("enqueued_at", "NULL"),
    ("processed_at", "NULL"),
    ("attempts", "0"),
    ("error", "''"),
)
_insert_sql_cache: dict[tuple[str, int], str] = {}


def _insert_sql(rows: int) -> str:
    key = (connection.vendor, rows)
    sql = _insert_sql_cache.get(key)
    if sql is None:
        qn = connection.ops.quote_name
        columns = [*_DRAFT_COLUMNS, *(c for c, _ in _DEFAULT_COLUMNS)]
        row = "(" + ", ".join(["%s"] * len(_DRAFT_COLUMNS) + [v for _, v in _DEFAULT_COLUMNS]) + ")"
        sql = (
            f"INSERT INTO {qn(InterruptionNotice._meta.db_table)} ({', '.join(qn(c) for c in columns)}) "
            f"VALUES {', '.join([row] * rows)} ON CONFLICT ({qn('dedup_key')}) DO NOTHING "
            f"RETURNING {qn('id')}, {qn('dedup_key')}"
        )
        _insert_sql_cache[key] = sql
    return sql


def _insert(sql: str, params: list) -> list[tuple[int, str]]:
    """Run the one-statement insert. On the request path (autocommit) it skips Django's per-request
    connection health check (`CONN_HEALTH_CHECKS`: a `SELECT 1` round trip, and PostgreSQL CPU, on
    every notice) and instead retries once on a fresh connection if the kept-alive one turns out to
    be dead. The retry is safe: the insert is idempotent (`ON CONFLICT DO NOTHING`)."""
    from django.db import InterfaceError, OperationalError

    if connection.in_atomic_block:  # a caller's transaction: no retry possible, keep Django's rules
        return _execute(sql, params)
    connection.health_check_done = True
    try:
        return _execute(sql, params)
    except (OperationalError, InterfaceError):
        if connection.connection is not None and connection.is_usable():
            raise  # the statement failed, not the connection
        logger.warning("database connection was dead; retrying the notice insert on a new one")
        connection.close()
        return _execute(sql, params)


def _execute(sql: str, params: list) -> list[tuple[int, str]]:
    """On PostgreSQL, a prepared statement with server-side parameters: the server skips parsing
    and planning, and the client sends the values as they are instead of quoting them into the
    SQL text (Django's cursors bind client-side and never prepare, so that transaction-mode
    connection poolers work: set SPOTPIPE_NOTICE_INSERT_PREPARED=0 behind one)."""
    if connection.vendor != "postgresql" or not tunable("SPOTPIPE_NOTICE_INSERT_PREPARED"):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, prepare=True)
        return cursor.fetchall()


def notices_store(*, drafts: list[NoticeDraft]) -> StoreResult:
    """Insert `drafts` with `INSERT ... ON CONFLICT (dedup_key) DO NOTHING RETURNING` (PostgreSQL
    and SQLite alike) in one statement, and hand the new ones to workers once committed.

    A duplicate (same dedup key) inserts nothing and kicks nothing."""
    if not drafts:
        return StoreResult(stored={}, duplicates=[])
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    adapt_dt = connection.ops.adapt_datetimefield_value
    adapt_json = _payload_field().get_db_prep_save
    params: list = []
    seen: set[str] = set()
    for draft in drafts:
        if draft.dedup_key in seen:  # the same event twice in one body
            continue
        seen.add(draft.dedup_key)
        params += (
            draft.team_id,
            draft.source,
            draft.kind,
            draft.action,
            draft.dedup_key,
            draft.cloud_event_id,
            draft.provider_instance_id,
            adapt_dt(draft.event_time),
            adapt_dt(draft.deadline),
            now,
            adapt_json(draft.payload, connection),
            False,
            NoticeStatus.RECEIVED.value,
        )
    # One statement needs no explicit transaction: in autocommit mode it commits by itself, which
    # saves the BEGIN and COMMIT round trips on the hot path. Inside a caller's transaction the
    # hand-off waits for that transaction's commit.
    stored = {key: pk for pk, key in _insert(_insert_sql(len(seen)), params)}
    if stored:
        ids = list(stored.values())
        transaction.on_commit(lambda: notices_handoff(notice_ids=ids))  # runs now in autocommit mode
    return StoreResult(stored=stored, duplicates=[key for key in seen if key not in stored])


def _payload_field() -> Any:
    return InterruptionNotice._meta.get_field("payload")
