"""Interruption notices: store first (one idempotent insert), hand stored notices to workers in
batches (an outbox), and react to each notice once.

Why an outbox: publishing one Celery message per notice costs more CPU than the insert itself
(docs/MEASURED.md), so the web request only inserts and *kicks*; a per-process kicker coalesces
kicks into at most one `drain_notices` publish per window, and the drain task claims `received`
rows in batches. The first notice after a quiet period is published at once (leading edge); those
that arrive during the window are covered by one trailing publish. A periodic sweep re-kicks
whatever was stored but never processed (worker or broker down)."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.accounts.services import agent_tokens_revoke
from controlplane.common.agent_wake import commands_changed
from controlplane.fleet.bulk import bulk_update_by_pk
from controlplane.fleet.models import (
    Instance,
    InstanceEvent,
    InterruptionNotice,
    Lifecycle,
    NoticeKind,
    NoticeStatus,
)
from controlplane.fleet.services import TRANSITION_FIELDS, instance_transition, instance_transition_locked
from controlplane.fleet.states import ALLOWED_TRANSITIONS, TERMINAL_STATES, IllegalTransition, InstanceState
from controlplane.jobs.models import JobEvent, JobGeneration, Reconfiguration, ReconfigurationTrigger
from controlplane.jobs.reconfiguration import (
    current_generations,
    reconfiguration_decide,
    reconfiguration_draft,
    reconfigurations_create,
)

logger = logging.getLogger(__name__)


def _setting(name: str, default: Any) -> Any:
    """A tunable read from Django settings, then the environment, then `default`."""
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name, default)
    return type(default)(value) if not isinstance(default, bool) else str(value).lower() in {"1", "true", "yes"}


# How stored notices reach workers: "batched" (coalesced kicks, the default), "per_request" (one
# Celery publish per stored notice: the slow baseline the bench compares with), "none" (only the
# periodic sweep; for tests that drive the drain by hand).
HANDOFF_SETTING = "SPOTPIPE_NOTICE_HANDOFF"
KICK_WINDOW_SETTING = "SPOTPIPE_NOTICE_KICK_WINDOW_S"
# Least time between the starts of two drains (see `drain_pace`); 0 turns pacing off.
DRAIN_SPACING_SETTING = "SPOTPIPE_NOTICE_DRAIN_SPACING_S"
PREPARED_INSERT_SETTING = "SPOTPIPE_NOTICE_INSERT_PREPARED"
CLAIM_STALE_AFTER = timedelta(seconds=30)
MAX_ATTEMPTS = 5

# State a notice's kind moves a running instance to (state-change events decide per state).
_LEAVING_EC2_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})


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
    if connection.vendor != "postgresql" or not _setting(PREPARED_INSERT_SETTING, True):
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


# --- hand-over to workers ---------------------------------------------------------------------


DRAIN_PENDING_KEY = "spotpipe:notices:drain-pending:{queue}"
DRAIN_PENDING_TTL_S = 30
_pending_client: tuple[int, Any] | None = None


def _pending_store() -> Any:
    """A Redis client on the broker's Redis (one per process), or None on the embedded broker.

    It holds one flag, "a drain is queued and has not started", shared by every web process and
    worker, so that at most one `drain_notices` waits in the queue however many kicks arrive."""
    global _pending_client
    url = getattr(settings, "CELERY_BROKER_URL", "") or ""
    if not url.startswith(("redis://", "rediss://")):
        return None
    if _pending_client is None or _pending_client[0] != os.getpid():
        import redis

        _pending_client = (os.getpid(), redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1))
    return _pending_client[1]


def _queue() -> str:
    from controlplane.celery import app

    return app.conf.task_default_queue or "celery"


def _pending_key() -> str:
    """The flag is per queue: it means "a drain is waiting in *this* queue"."""
    return DRAIN_PENDING_KEY.format(queue=_queue())


def _publish_drain() -> bool:
    """Ask a worker to drain stored notices, unless a drain is already queued and not yet started
    (it will claim after our commit, so it covers our rows). Returns whether it published."""
    from controlplane.fleet.tasks import drain_notices

    client = _pending_store()
    if client is not None:
        try:
            if not client.set(_pending_key(), "1", nx=True, ex=DRAIN_PENDING_TTL_S):
                return False
        except Exception:  # Redis unreachable: publish anyway (extra drains are harmless)
            logger.warning("drain-pending flag unavailable; publishing without it", exc_info=True)
            client = None
    try:
        drain_notices.delay()
    except Exception:
        if client is not None:
            client.delete(_pending_key())  # let the next kick try again
        raise
    return True


DRAIN_LAST_START_KEY = "spotpipe:notices:drain-last-start:{queue}"
_last_drain_start = 0.0  # without Redis (embedded broker): this worker process's own last start


def drain_pace() -> None:
    """Called by a drain before it clears the pending flag and claims: if the previous drain
    started less than the spacing ago, wait out the rest.

    Why: a batch costs the same statements for 1 or 200 notices. Unpaced, drains run back to back
    during a burst, each claiming what arrived while the previous one ran (a few dozen notices),
    and the worker's CPU per notice tripled in the bench (0.38 ms with big batches, 0.7-1.1 ms with
    small ones), CPU the web server needed for ingest. Paced, a burst is processed in batches that
    grow with the arrival rate. The first drain after a quiet spell does not wait, so a lone notice
    still reacts within milliseconds; under a burst a reaction waits at most one spacing more.
    Kicks during the wait publish nothing: the pending flag is still set and this drain claims
    after their commits."""
    global _last_drain_start
    spacing = _setting(DRAIN_SPACING_SETTING, 0.25)
    if spacing <= 0:
        return
    client = _pending_store()
    key = DRAIN_LAST_START_KEY.format(queue=_queue())
    last = _last_drain_start
    if client is not None:
        try:
            last = float(client.get(key) or 0.0)
        except Exception:  # Redis unreachable: pace on this process's own record
            client = None
    wait = last + spacing - time.time()
    if wait > 0:
        time.sleep(min(wait, spacing))
    _last_drain_start = time.time()
    if client is not None:
        try:
            client.set(key, repr(_last_drain_start), ex=60)
        except Exception:
            logger.warning("could not record the drain start; pacing on this process's own record")


def drain_started() -> None:
    """Called by a drain before it claims: from now on a new kick must queue another drain."""
    client = _pending_store()
    if client is not None:
        try:
            client.delete(_pending_key())
        except Exception:
            logger.warning("could not clear the drain-pending flag; it expires in %d s", DRAIN_PENDING_TTL_S)


class _Kicker:
    """Coalesces kicks into at most one `drain_notices` publish per window, per process, off the
    request path: a daemon thread publishes at once when idle (leading edge), then sleeps for the
    window; kicks that arrive meanwhile are covered by the next publish (trailing edge). Every kick
    is therefore followed by a publish that starts after it, so no committed notice waits for the
    sweep unless the broker is down. On Redis, a shared "drain pending" flag also skips the publish
    while a drain is queued and not yet started, so kicks never pile up behind a busy worker."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self.publishes = 0

    def kick(self) -> None:
        self._ensure_thread()
        self._wake.set()

    def _ensure_thread(self) -> None:
        # A forked child (gunicorn worker) inherits the object but not the thread.
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
                return
            self._wake = threading.Event()
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="notice-kicker", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                if _publish_drain():
                    self.publishes += 1
            except Exception:  # the broker is down: the rows are stored, the sweep will find them
                logger.exception("could not publish drain_notices; the periodic sweep will retry")
            time.sleep(_setting(KICK_WINDOW_SETTING, 0.1))


_kicker = _Kicker()


def notices_handoff(*, notice_ids: list[int]) -> None:
    """Tell workers that notices were stored (called on commit of the insert)."""
    mode = _setting(HANDOFF_SETTING, "batched")
    if mode == "none":
        return
    if mode == "per_request":
        from controlplane.fleet.tasks import process_notice

        for notice_id in notice_ids:
            try:
                process_notice.delay(notice_id)
            except Exception:
                logger.exception("could not publish process_notice(%s); the sweep will retry", notice_id)
        return
    _kicker.kick()


# --- claiming and processing -------------------------------------------------------------------


def notices_claim(*, limit: int) -> list[int]:
    """Claim up to `limit` received notices, oldest first, for this worker: mark them enqueued and
    count the attempt. On PostgreSQL concurrent drains skip each other's locked rows; on SQLite the
    immediate transaction serialises them."""
    with transaction.atomic():
        qs = InterruptionNotice.objects.filter(status=NoticeStatus.RECEIVED).order_by("received_at", "id")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        ids = list(qs.values_list("id", flat=True)[:limit])
        if ids:
            InterruptionNotice.objects.filter(id__in=ids).update(
                status=NoticeStatus.ENQUEUED, enqueued_at=timezone.now(), attempts=F("attempts") + 1
            )
    return ids


def _instance_keys(notice: InterruptionNotice) -> list[str]:
    keys = [notice.provider_instance_id]
    name = (notice.payload or {}).get("meta", {}).get("instance_name")
    if name:
        keys.append(name)
    return keys


def _target_state(notice: InterruptionNotice, instance: Instance) -> str | None:
    if notice.kind == NoticeKind.INTERRUPTION:
        return InstanceState.NOTICE
    if notice.kind == NoticeKind.PREEMPTED:
        return InstanceState.PREEMPTED
    if notice.kind == NoticeKind.STATE_CHANGE and notice.action in _LEAVING_EC2_STATES:
        return InstanceState.PREEMPTED if instance.lifecycle == Lifecycle.SPOT else InstanceState.TERMINATED
    return None


def _describe(notice: InterruptionNotice) -> str:
    label = dict(NoticeKind.choices).get(notice.kind, notice.kind)
    text = f"{label} for {notice.provider_instance_id} via {notice.source}"
    if notice.action:
        text += f" ({notice.action})"
    if notice.deadline:
        text += f", expected to go at {notice.deadline.isoformat()}"
    return text[:300]


# Instances of a batch, locked and loaded once: {(team_id, provider_instance_id): Instance}.
InstanceMap = dict[tuple[int, str], Instance]


def _find_instance(notice: InterruptionNotice, known: InstanceMap | None = None) -> Instance | None:
    if known is not None and notice.team_id is not None:
        # The batch loaded every candidate; absent means unknown (same answer as the query below).
        found = [known[(notice.team_id, key)] for key in _instance_keys(notice) if (notice.team_id, key) in known]
        return min(found, key=lambda i: i.pk) if found else None
    qs = Instance.objects.select_related("job").filter(provider_instance_id__in=_instance_keys(notice))
    if notice.team_id is not None:
        qs = qs.filter(team_id=notice.team_id)
    return qs.order_by("id").first()


def _transition_if_allowed(notice: InterruptionNotice, instance: Instance, target: str) -> bool:
    """Move the instance unless a concurrent notice already moved it past `target` (the state we
    read was not locked; `instance_transition` re-checks under the row lock)."""
    try:
        instance_transition(instance=instance, to=target, detail=_transition_detail(notice))
    except IllegalTransition:
        instance.refresh_from_db(fields=["state"])
        return False
    return True


def _transition_detail(notice: InterruptionNotice) -> dict:
    # The event is stamped when we learn of it, so the instance's log stays in order; the cloud's
    # own time is in the detail.
    return {
        "notice": notice.pk,
        "source": notice.source,
        "kind": notice.kind,
        "action": notice.action,
        "event_time": notice.event_time.isoformat() if notice.event_time else None,
    }


@dataclass(slots=True)
class _Batch:
    """What a batch collects for its bulk writes: the instances it locked and loaded (`known`),
    the rows to insert, the instances it moved, and the reconfigurations it decided."""

    known: InstanceMap
    now: datetime
    job_events: list[JobEvent] = field(default_factory=list)
    instance_events: list[InstanceEvent] = field(default_factory=list)
    moved: dict[int, Instance] = field(default_factory=dict)
    # The current generation of each of the batch's jobs that has one (read once for the batch),
    # the reconfigurations to record (one per leaving node: the first notice of a node wins) and
    # their keys.
    generations: dict[int, JobGeneration] = field(default_factory=dict)
    drafts: list[Reconfiguration] = field(default_factory=list)
    decided: set[tuple[int, str]] = field(default_factory=set)


def _react(notice: InterruptionNotice, batch: _Batch | None = None) -> None:
    """Move the instance, record the event on the job's timeline, and ask for a reconfiguration.
    In a batch, the instances are already locked and loaded, and the rows are written in bulk by
    the caller."""
    instance = _find_instance(notice, batch.known if batch is not None else None)
    if instance is None:
        # Kept and flagged: an instance we do not know yet (or another team's) is worth seeing.
        notice.unknown_instance = True
        return
    notice.instance = instance
    if notice.team_id is None:
        notice.team_id = instance.team_id
    target = _target_state(notice, instance)
    transitioned = False
    if target and instance.state != target and target in ALLOWED_TRANSITIONS[instance.state]:
        if batch is not None and batch.known.get((instance.team_id, instance.provider_instance_id)) is instance:
            # The batch locked and loaded this row, so it is current: move it in memory, save in bulk.
            batch.instance_events.append(
                instance_transition_locked(
                    instance=instance, to=target, at=batch.now, detail=_transition_detail(notice)
                )
            )
            batch.moved[instance.pk] = instance
            transitioned = True
        else:
            transitioned = _transition_if_allowed(notice, instance, target)
    job = instance.job
    if job is None:
        return
    event = JobEvent(
        job=job,
        kind=f"instance_{notice.kind}",
        message=_describe(notice),
        data={
            "notice": notice.pk,
            "instance": instance.pk,
            "source": notice.source,
            "kind": notice.kind,
            "action": notice.action,
            "deadline": notice.deadline.isoformat() if notice.deadline else None,
            "instance_state": instance.state,
            "transitioned": transitioned,
        },
        at=timezone.now(),
    )
    if batch is not None:
        batch.job_events.append(event)
    else:
        event.save()
    if target is not None:
        # One reconfiguration per leaving node, whichever notice (warning, state change) comes first.
        trigger_key = f"leave:instance:{instance.pk}"
        if batch is None:
            reconfiguration_decide(
                job=job,
                trigger=ReconfigurationTrigger.NOTICE,
                trigger_key=trigger_key,
                instance=instance,
                notice=notice,
            )
            return
        if (job.pk, trigger_key) in batch.decided:
            return  # this batch already decided it (reconfiguration_decide would return that row)
        batch.decided.add((job.pk, trigger_key))
        # The decision input is taken now, as reconfiguration_decide would; the batch inserts the
        # drafts together (and skips keys decided before the batch), with one statement.
        known_generation = job.pk in batch.generations or not job.current_generation
        extra = {"generation": batch.generations.get(job.pk)} if known_generation else {}
        batch.drafts.append(
            reconfiguration_draft(
                job=job,
                trigger=ReconfigurationTrigger.NOTICE,
                trigger_key=trigger_key,
                instance=instance,
                notice=notice,
                **extra,
            )
        )


_DONE_FIELDS = ["status", "processed_at", "error", "unknown_instance", "instance", "team"]


def _mark_processed(notice: InterruptionNotice, at: datetime | None = None) -> None:
    notice.status = NoticeStatus.PROCESSED
    notice.processed_at = at or timezone.now()
    notice.error = ""


def notice_process(*, notice_id: int) -> InterruptionNotice | None:
    """React to one notice exactly once: a processed notice is left alone, so a redelivered task or
    an overlapping drain does nothing the second time."""
    with transaction.atomic():
        notice = InterruptionNotice.objects.select_for_update().filter(pk=notice_id).first()
        if notice is None or notice.status in (NoticeStatus.PROCESSED, NoticeStatus.FAILED):
            return notice
        _react(notice)
        _mark_processed(notice)
        notice.save(update_fields=_DONE_FIELDS)
    return notice


def _lock_instances(rows: list[InterruptionNotice]) -> InstanceMap | None:
    """Lock and load every instance the batch may move, in id order, before touching any: two
    drains then queue on the same order instead of deadlocking on each other's rows. Returns None
    (look each up) when a notice has no team."""
    keys = {key for notice in rows for key in _instance_keys(notice)}
    teams = {notice.team_id for notice in rows}
    if not keys:
        return {}
    qs = Instance.objects.select_for_update(of=("self",)).select_related("job").filter(provider_instance_id__in=keys)
    if None in teams:
        list(qs.order_by("id").values_list("id", flat=True))
        return None
    return {(i.team_id, i.provider_instance_id): i for i in qs.filter(team_id__in=teams).order_by("id")}


def notices_process_batch(*, notice_ids: list[int]) -> tuple[int, int]:
    """Process claimed notices in one transaction (one commit for the batch rather than one per
    notice: on a busy disk the commit is most of the wall time), with a constant number of
    statements for the batch's own rows: lock the notices, lock and load their instances (and read
    their jobs' current generations, when any has one), then one insert each for the instance and
    job events, one query for the reconfigurations already decided and one insert for the new ones,
    and one update each for the instances and the notices. Orchestration applies the new
    reconfigurations together once this commits (`orchestration.signals`).
    If any notice fails, the batch is rolled back and each notice is processed on its own, so one
    bad notice cannot block the rest. Returns (processed, failed)."""
    try:
        with transaction.atomic():
            rows = list(
                InterruptionNotice.objects.select_for_update()
                .filter(id__in=notice_ids)
                .exclude(status__in=[NoticeStatus.PROCESSED, NoticeStatus.FAILED])
                .order_by("id")
            )
            known = _lock_instances(rows)
            if known is None:  # a notice without a team: the one-by-one path resolves it
                for notice in rows:
                    _react(notice)
                    _mark_processed(notice)
                    notice.save(update_fields=_DONE_FIELDS)
                return len(notice_ids), 0
            generations = current_generations(jobs=[i.job for i in known.values() if i.job is not None])
            batch = _Batch(known=known, now=timezone.now(), generations=generations)
            for notice in rows:
                _react(notice, batch)
                _mark_processed(notice, batch.now)
            InstanceEvent.objects.bulk_create(batch.instance_events)
            bulk_update_by_pk(Instance, list(batch.moved.values()), TRANSITION_FIELDS)
            commands_changed(instance_ids=list(batch.moved))
            agent_tokens_revoke(
                instance_ids=[pk for pk, i in batch.moved.items() if i.state in TERMINAL_STATES], at=batch.now
            )
            JobEvent.objects.bulk_create(batch.job_events)
            # One reconfiguration per leaving node; orchestration applies the batch's on commit.
            reconfigurations_create(drafts=batch.drafts)
            bulk_update_by_pk(InterruptionNotice, rows, _DONE_FIELDS)
        return len(notice_ids), 0
    except Exception:
        logger.warning("batch of %d notices failed; processing them one by one", len(notice_ids), exc_info=True)
    processed = failed = 0
    for notice_id in notice_ids:
        try:
            notice_process(notice_id=notice_id)
            processed += 1
        except Exception as exc:
            logger.exception("processing notice %s failed", notice_id)
            notice_record_failure(notice_id=notice_id, error=f"{type(exc).__name__}: {exc}")
            failed += 1
    return processed, failed


def notice_record_failure(*, notice_id: int, error: str) -> None:
    """Keep a failed attempt's error; the row stays claimed and the sweep retries it after
    CLAIM_STALE_AFTER, or gives up after MAX_ATTEMPTS."""
    InterruptionNotice.objects.filter(pk=notice_id).exclude(status=NoticeStatus.PROCESSED).update(error=error[:2000])


@dataclass(kw_only=True, slots=True)
class DrainResult:
    processed: int = 0
    failed: int = 0
    batches: int = 0
    more: bool = False


def _chunk_size() -> int:
    """Notices per processing transaction. A transaction costs the same statements for 1 or 200
    notices, so bigger is cheaper per notice (drain_notices in process, 2,400 bench notices,
    PostgreSQL: 0.62-0.65 ms of CPU per notice in chunks of 50, 0.49-0.52 in chunks of 200); on
    SQLite, short transactions keep its single writer free for the web requests' inserts."""
    return 200 if connection.vendor == "postgresql" else 50


def notices_drain(
    *, batch_size: int = 200, chunk_size: int | None = None, time_budget_s: float = 5.0, paced: bool = False
) -> DrainResult:
    """Claim and process received notices in batches until none are left or the time budget is
    spent (then `more` is set so the caller can re-kick rather than hold the worker). Each claimed
    batch is processed in transactions of `chunk_size` notices (default `_chunk_size()`). `paced`
    (the kicked drain, after `drain_pace`): stop once a claim comes back short of `batch_size`."""
    chunk_size = chunk_size or _chunk_size()
    result = DrainResult()
    started = time.monotonic()
    while True:
        ids = notices_claim(limit=batch_size)
        if not ids:
            return result
        result.batches += 1
        for start in range(0, len(ids), chunk_size):
            processed, failed = notices_process_batch(notice_ids=ids[start : start + chunk_size])
            result.processed += processed
            result.failed += failed
        if paced and len(ids) < batch_size:
            # Caught up: what arrives from now on gets its own (paced) drain from the next kick,
            # rather than a stream of small claims from this one.
            return result
        if time.monotonic() - started > time_budget_s:
            result.more = InterruptionNotice.objects.filter(status=NoticeStatus.RECEIVED).exists()
            return result


def notice_retry(*, notice: InterruptionNotice) -> InterruptionNotice:
    """Give a failed notice (MAX_ATTEMPTS spent) another round: back to received with its attempts
    reset (its last error kept until it is processed), handed to the workers on commit exactly as
    a new one. Any other status is a Conflict: a processed notice is never reacted to twice."""
    from controlplane.common.errors import Conflict

    with transaction.atomic():
        locked = InterruptionNotice.objects.select_for_update().get(pk=notice.pk)
        if locked.status != NoticeStatus.FAILED:
            raise Conflict(f"notice {locked.pk} is {locked.status}; only a failed notice is retried", field="status")
        locked.status = NoticeStatus.RECEIVED
        locked.attempts = 0
        locked.enqueued_at = None
        locked.save(update_fields=["status", "attempts", "enqueued_at"])
        transaction.on_commit(lambda: notices_handoff(notice_ids=[locked.pk]))
    return locked


def notices_requeue_stale(*, older_than: timedelta = CLAIM_STALE_AFTER) -> int:
    """Put back notices claimed long ago and never processed (the worker died, or processing
    failed), so the next drain retries them; give up after MAX_ATTEMPTS."""
    cutoff = timezone.now() - older_than
    stale = InterruptionNotice.objects.filter(status=NoticeStatus.ENQUEUED, enqueued_at__lt=cutoff)
    stale.filter(attempts__gte=MAX_ATTEMPTS).update(status=NoticeStatus.FAILED)
    return stale.filter(attempts__lt=MAX_ATTEMPTS).update(status=NoticeStatus.RECEIVED)


def notices_sweep(*, batch_size: int = 200, time_budget_s: float = 5.0) -> DrainResult:
    """The periodic safety net: requeue stale claims, then drain the backlog."""
    requeued = notices_requeue_stale()
    if requeued:
        logger.warning("requeued %d notices that were claimed but never processed", requeued)
    return notices_drain(batch_size=batch_size, time_budget_s=time_budget_s)
