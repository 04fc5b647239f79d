"""From a stored notice to its reaction: claiming in batches, processing exactly once, the sweep
that re-queues what was never processed, the coalescing kicker, and the reconfiguration input."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.fleet import notices
from controlplane.fleet.models import InterruptionNotice, NoticeKind, NoticeSource, NoticeStatus
from controlplane.fleet.notices import MAX_ATTEMPTS, NoticeDraft, claims, handoff, notices_claim, notices_store
from controlplane.fleet.services import instance_transition
from controlplane.jobs.models import JobEvent, JobGeneration, Reconfiguration
from controlplane.jobs.reconfiguration import reconfiguration_decide
from controlplane.orchestration import tasks
from controlplane.orchestration.notices import (
    notice_process,
    notices_drain,
    notices_process_batch,
    notices_sweep,
    processing,
)
from tests.controlplane.factories import make_instance, make_job, make_team

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_handoff(settings):
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"


def draft(team, instance_id: str, key: str, kind=NoticeKind.INTERRUPTION, **kw) -> NoticeDraft:
    return NoticeDraft(team_id=team.pk, source=NoticeSource.GENERIC, kind=kind, action=kw.pop("action", "terminate"),
                       dedup_key=f"{team.pk}:test:{key}", provider_instance_id=instance_id, **kw)


def running(team, **kw):
    instance = make_instance(team, **kw)
    for state in ("pending", "running"):
        instance_transition(instance=instance, to=state)
    return instance


# On PostgreSQL the insert is a prepared statement with server-side parameters unless turned off
# (behind a transaction-mode pooler); elsewhere the setting changes nothing. Both paths must agree.
INSERT_PATHS = pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "django-cursor"])


@INSERT_PATHS
def test_store_is_idempotent_within_and_across_calls(settings, prepared):
    settings.SPOTPIPE_NOTICE_INSERT_PREPARED = prepared
    team = make_team()
    first = notices_store(drafts=[draft(team, "i-1", "a"), draft(team, "i-1", "a"), draft(team, "i-2", "b")])
    assert sorted(first.stored) == [f"{team.pk}:test:a", f"{team.pk}:test:b"]
    second = notices_store(drafts=[draft(team, "i-1", "a"), draft(team, "i-3", "c")])
    assert list(second.stored) == [f"{team.pk}:test:c"]
    assert second.duplicates == [f"{team.pk}:test:a"]
    assert InterruptionNotice.objects.count() == 3


@INSERT_PATHS
def test_every_column_round_trips_through_the_insert(settings, prepared):
    settings.SPOTPIPE_NOTICE_INSERT_PREPARED = prepared
    team = make_team()
    at = timezone.now().replace(microsecond=123456)
    payload = {"detail": {"instance-id": "i-9", "note": "quote ' and \\ and unicode \u00e9"}, "n": [1, 2.5, None]}
    stored = notices_store(drafts=[draft(team, "i-9", "x", event_time=at, deadline=at + timedelta(minutes=2),
                                         cloud_event_id="evt-1", payload=payload)])
    row = InterruptionNotice.objects.get(pk=stored.stored[f"{team.pk}:test:x"])
    assert (row.team_id, row.source, row.kind) == (team.pk, NoticeSource.GENERIC, "interruption")
    assert row.action == "terminate"
    assert (row.cloud_event_id, row.provider_instance_id, row.payload) == ("evt-1", "i-9", payload)
    assert (row.event_time, row.deadline) == (at, at + timedelta(minutes=2))
    assert (row.status, row.unknown_instance, row.attempts, row.instance_id) == (NoticeStatus.RECEIVED, False, 0, None)


def test_claim_takes_batches_oldest_first_and_counts_attempts():
    team = make_team()
    notices_store(drafts=[draft(team, f"i-{n}", str(n)) for n in range(5)])
    first = notices_claim(limit=3)
    second = notices_claim(limit=3)
    assert len(first) == 3 and len(second) == 2 and not set(first) & set(second)
    assert notices_claim(limit=3) == []
    assert set(InterruptionNotice.objects.values_list("status", "attempts")) == {(NoticeStatus.ENQUEUED, 1)}


def test_claim_takes_agents_notices_before_a_backlog_of_cloud_notices():
    """A webhook burst's backlog must not stand between an agent's notice and its job's reaction."""
    team = make_team()
    notices_store(drafts=[draft(team, f"i-{n}", str(n)) for n in range(5)])  # the burst, received first
    agent = notices_store(drafts=[NoticeDraft(
        team_id=team.pk, source=NoticeSource.AGENT, kind=NoticeKind.INTERRUPTION, action="terminate",
        dedup_key=f"{team.pk}:agent:a", provider_instance_id="i-agent",
    )])
    agent_id = next(iter(agent.stored.values()))
    first = notices_claim(limit=2)
    assert first[0] == agent_id
    oldest_cloud = InterruptionNotice.objects.exclude(pk=agent_id).order_by("received_at", "id").first()
    assert first[1] == oldest_cloud.pk  # the rest stay oldest first


def test_a_drain_reacts_to_agents_notices_in_a_transaction_before_the_rest(monkeypatch):
    team = make_team()
    notices_store(drafts=[draft(team, f"i-{n}", str(n)) for n in range(4)])
    agent = notices_store(drafts=[NoticeDraft(
        team_id=team.pk, source=NoticeSource.AGENT, kind=NoticeKind.INTERRUPTION, action="terminate",
        dedup_key=f"{team.pk}:agent:b", provider_instance_id="i-agent",
    )])
    chunks: list[list[int]] = []
    real_batch = processing.notices_process_batch

    def batch(*, notice_ids):
        chunks.append(list(notice_ids))
        return real_batch(notice_ids=notice_ids)

    monkeypatch.setattr(processing, "notices_process_batch", batch)
    assert notices_drain(chunk_size=50).processed == 5
    assert chunks[0] == list(agent.stored.values())
    assert sorted(chunks[1]) == sorted(InterruptionNotice.objects.exclude(source=NoticeSource.AGENT).values_list(
        "pk", flat=True))


def test_processing_twice_acts_once():
    team = make_team()
    job = make_job(team)
    instance = running(team, job=job)
    stored = notices_store(drafts=[draft(team, instance.provider_instance_id, "a")])
    notice_id = next(iter(stored.stored.values()))
    notice_process(notice_id=notice_id)
    notice_process(notice_id=notice_id)  # a redelivered task
    assert JobEvent.objects.filter(job=job).exclude(kind="submitted").count() == 1
    assert instance.events.filter(to_state="notice").count() == 1
    assert Reconfiguration.objects.filter(job=job).count() == 1
    assert InterruptionNotice.objects.get().status == NoticeStatus.PROCESSED


def test_two_notices_for_the_same_node_reconfigure_once_and_state_only_moves_forward():
    team = make_team()
    job = make_job(team)
    instance = running(team, job=job)
    notices_store(drafts=[
        draft(team, instance.provider_instance_id, "warn"),
        draft(team, instance.provider_instance_id, "gone", kind=NoticeKind.PREEMPTED, action="preempted"),
        draft(team, instance.provider_instance_id, "late-warn"),  # a late duplicate from another channel
    ])
    assert notices_drain().processed == 3
    instance.refresh_from_db()
    assert instance.state == "preempted"
    assert Reconfiguration.objects.filter(job=job).count() == 1
    assert JobEvent.objects.filter(job=job).exclude(kind="submitted").count() == 3
    events = JobEvent.objects.filter(job=job).exclude(kind="submitted")
    assert [e.data["transitioned"] for e in events] == [True, True, False]


def test_reconfiguration_records_the_decision_input():
    team = make_team()
    job = make_job(team, strategy="bamboo", current_generation=2)
    leaving = running(team, job=job)
    peer = running(team, job=job)
    JobGeneration.objects.create(job=job, number=2, created_at=timezone.now(), membership=[
        {"instance": leaving.pk, "rank": 0, "pipeline": 0, "stage": 0},
        {"instance": peer.pk, "rank": 1, "pipeline": 0, "stage": 1},
    ])
    deadline = timezone.now() + timedelta(seconds=120)
    notices_store(drafts=[draft(team, leaving.provider_instance_id, "a", deadline=deadline)])
    notices_drain()
    reconf = Reconfiguration.objects.get(job=job)
    data = reconf.decision_input
    assert (reconf.strategy, reconf.from_generation, reconf.trigger) == ("bamboo", 2, "notice")
    assert data["leaving_instance"]["member"] == {"instance": leaving.pk, "rank": 0, "pipeline": 0, "stage": 0}
    assert data["survivors"] == 1
    assert data["members"] == 2 and "membership" not in data  # the generation's, not copied here
    assert 100 < data["lead_time_s"] <= 120
    again = reconfiguration_decide(job=job, trigger="notice", trigger_key=reconf.trigger_key, instance=leaving)
    assert again.pk == reconf.pk


def test_rebalance_records_the_event_without_moving_or_reconfiguring():
    team = make_team()
    job = make_job(team)
    instance = running(team, job=job)
    notices_store(drafts=[draft(team, instance.provider_instance_id, "r", kind=NoticeKind.REBALANCE, action="")])
    notices_drain()
    instance.refresh_from_db()
    assert instance.state == "running"
    assert JobEvent.objects.exclude(kind="submitted").get(job=job).kind == "instance_rebalance"
    assert not Reconfiguration.objects.exists()


def test_failed_processing_is_retried_by_the_sweep_then_given_up(monkeypatch):
    team = make_team()
    instance = running(team, job=make_job(team))
    notices_store(drafts=[draft(team, instance.provider_instance_id, "a")])
    real_react = processing.react

    def broken(notice, batch):
        raise RuntimeError("database hiccup")

    monkeypatch.setattr(processing, "react", broken)
    result = notices_drain()
    assert (result.processed, result.failed) == (0, 1)
    notice = InterruptionNotice.objects.get()
    assert notice.status == NoticeStatus.ENQUEUED and "database hiccup" in notice.error
    # Not yet stale: the sweep leaves it alone.
    assert notices_sweep().processed == 0
    InterruptionNotice.objects.update(enqueued_at=timezone.now() - timedelta(minutes=5))
    monkeypatch.setattr(processing, "react", real_react)
    assert notices_sweep().processed == 1
    notice.refresh_from_db()
    assert (notice.status, notice.attempts, notice.error) == (NoticeStatus.PROCESSED, 2, "")
    # A notice that keeps failing stops after MAX_ATTEMPTS.
    notices_store(drafts=[draft(team, "i-x", "b")])
    InterruptionNotice.objects.filter(dedup_key__endswith=":b").update(
        status=NoticeStatus.ENQUEUED, attempts=MAX_ATTEMPTS, enqueued_at=timezone.now() - timedelta(minutes=5)
    )
    notices_sweep()
    assert InterruptionNotice.objects.get(dedup_key__endswith=":b").status == NoticeStatus.FAILED


def test_kicker_publishes_at_once_then_coalesces(monkeypatch, settings):
    """100 kicks in a burst: the first is published at once, the rest fold into one trailing
    publish that starts after the last kick."""
    # A window long enough that the 99 kicks below fall in it even when a loaded machine
    # deschedules this thread for a while (with 0.3 s a late kick could start a third publish).
    settings.SPOTPIPE_NOTICE_KICK_WINDOW_S = 1.5
    published: list[float] = []
    first = threading.Event()
    trailing = threading.Event()

    def publish():
        published.append(1)
        (first if len(published) == 1 else trailing).set()

    monkeypatch.setattr(handoff, "_publish_drain", publish)
    kicker = handoff._Kicker()
    kicker.kick()
    assert first.wait(5), "the first kick after a quiet period must publish at once"
    for _ in range(99):
        kicker.kick()
    assert trailing.wait(5), "kicks during the window must be covered by a trailing publish"
    assert len(published) == 2


def test_handoff_modes(monkeypatch, settings):
    calls = []
    monkeypatch.setattr(handoff._kicker, "kick", lambda: calls.append("kick"))
    monkeypatch.setattr(tasks.process_notice, "delay", lambda notice_id: calls.append(notice_id))
    settings.SPOTPIPE_NOTICE_HANDOFF = "batched"
    notices.notices_handoff(notice_ids=[1, 2])
    settings.SPOTPIPE_NOTICE_HANDOFF = "per_request"
    notices.notices_handoff(notice_ids=[1, 2])
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"
    notices.notices_handoff(notice_ids=[1, 2])
    assert calls == ["kick", 1, 2]


def test_a_node_another_drain_already_moved_is_recorded_not_moved_again():
    """Two drains may race for notices of the same node; the batch reads its instances under their
    row locks, so the second finds the node already moved and records its notice without moving
    it again or failing."""
    team = make_team()
    job = make_job(team)
    instance = running(team, job=job)
    notices_store(drafts=[draft(team, instance.provider_instance_id, "a")])
    instance_transition(instance=instance, to="notice")  # the other drain won
    result = notices_drain()
    assert (result.processed, result.failed) == (1, 0)
    assert JobEvent.objects.exclude(kind="submitted").get(job=job).data["transitioned"] is False
    assert instance.events.filter(to_state="notice").count() == 1


def test_a_notice_without_a_team_is_processed_in_the_batch_and_finds_its_node():
    """A notice whose source names no team (its team is learnt from the node) goes through the same
    batch as every other notice, beside notices that have one."""
    team = make_team()
    job = make_job(team)
    first, second = running(team, job=job), running(team, job=job)
    notices_store(drafts=[draft(team, first.provider_instance_id, "a")])
    anonymous = draft(team, second.provider_instance_id, "b")
    anonymous.team_id = None
    notices_store(drafts=[anonymous])
    assert notices_drain().processed == 2
    stored = InterruptionNotice.objects.get(provider_instance_id=second.provider_instance_id)
    assert (stored.team_id, stored.instance_id, stored.unknown_instance) == (team.pk, second.pk, False)
    assert Reconfiguration.objects.filter(job=job).count() == 2


class _FakeRedis:
    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def set(self, key, value, nx=False, ex=None):
        if nx and key in self.keys:
            return None
        self.keys[key] = value
        return True

    def get(self, key):
        return self.keys.get(key)

    def delete(self, key):
        self.keys.pop(key, None)


def test_at_most_one_drain_waits_in_the_queue(monkeypatch):
    """Across web processes, a kick while a drain is queued (not yet started) publishes nothing: that
    drain will claim after the kick's commit. Once it starts, the next kick queues another."""
    fake = _FakeRedis()
    published = []
    monkeypatch.setattr(handoff, "_pending_store", lambda: fake)
    monkeypatch.setattr(tasks.drain_notices, "delay", lambda: published.append(1))
    assert handoff._publish_drain() is True
    assert handoff._publish_drain() is False
    assert handoff._publish_drain() is False
    notices.drain_started()
    assert handoff._publish_drain() is True
    assert len(published) == 2


def test_failed_publish_releases_the_pending_flag(monkeypatch):
    fake = _FakeRedis()
    monkeypatch.setattr(handoff, "_pending_store", lambda: fake)

    def down():
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.drain_notices, "delay", down)
    with pytest.raises(ConnectionError):
        handoff._publish_drain()
    assert fake.keys == {}


def _batch_statements(team, count: int, tag: str) -> tuple[int, list]:
    """Statements of `notices_process_batch` for `count` interruption notices, each for its own
    running instance of one job (so every notice moves an instance and adds a timeline event), all
    leaving nodes already decided (so no reconfiguration insert is counted)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = make_job(team)
    instances = [running(team, job=job, provider_instance_id=f"i-{tag}-{n}") for n in range(count)]
    for instance in instances:
        reconfiguration_decide(job=job, trigger="notice", trigger_key=f"leave:instance:{instance.pk}",
                               instance=instance)
    stored = notices_store(drafts=[draft(team, i.provider_instance_id, f"{tag}-{n}") for n, i in enumerate(instances)])
    with CaptureQueriesContext(connection) as queries:
        assert notices_process_batch(notice_ids=list(stored.stored.values())) == (count, 0)
    return len(queries.captured_queries), instances


def test_a_batch_costs_the_same_statements_for_2_notices_as_for_20():
    team = make_team()
    small, _ = _batch_statements(team, 2, "small")
    large, instances = _batch_statements(team, 20, "large")
    assert large == small, (small, large)
    # ... and the bulk writes did what instance_transition does, for every instance.
    for instance in instances:
        instance.refresh_from_db()
        assert instance.state == "notice" and instance.notice_at is not None
        assert list(instance.events.values_list("from_state", "to_state"))[-1] == ("running", "notice")
    assert InterruptionNotice.objects.filter(status=NoticeStatus.PROCESSED).count() == 22
    assert JobEvent.objects.filter(kind="instance_interruption").count() == 22


def test_a_paced_drain_stops_once_it_has_caught_up(monkeypatch):
    """The kicked drain ends after a claim that came back short: what arrives later gets its own
    paced drain (one big batch) instead of a stream of small claims from this one."""
    team = make_team()
    claimed: list[list[int]] = []
    real_claim = claims.notices_claim_by_lane

    def claim(*, limit):
        agents, others = real_claim(limit=limit)
        claimed.append(agents + others)
        return agents, others

    monkeypatch.setattr(processing, "notices_claim_by_lane", claim)
    notices_store(drafts=[draft(team, f"i-{n}", f"a{n}") for n in range(5)])
    assert notices_drain(batch_size=3, paced=True).processed == 5
    assert [len(c) for c in claimed] == [3, 2]  # no claim after the short one
    claimed.clear()
    notices_store(drafts=[draft(team, f"i-{n}", f"b{n}") for n in range(5)])
    assert notices_drain(batch_size=3).processed == 5  # the sweep's drain claims until nothing is left
    assert [len(c) for c in claimed] == [3, 2, 0]


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "per-process"])
def test_drains_start_at_most_once_per_spacing(monkeypatch, settings, shared):
    settings.SPOTPIPE_NOTICE_DRAIN_SPACING_S = 0.25
    fake = _FakeRedis()
    monkeypatch.setattr(handoff, "_pending_store", lambda: fake if shared else None)
    monkeypatch.setattr(handoff, "_last_drain_start", 0.0)
    slept: list[float] = []
    monkeypatch.setattr(handoff.time, "sleep", slept.append)
    notices.drain_pace()  # the first drain after a quiet spell starts at once
    assert slept == []
    notices.drain_pace()  # the next one waits out the rest of the spacing
    assert len(slept) == 1 and 0.2 < slept[0] <= 0.25
    assert bool(fake.keys) is shared  # shared by every worker process through Redis when there is one
    settings.SPOTPIPE_NOTICE_DRAIN_SPACING_S = 0  # pacing off
    notices.drain_pace()
    assert len(slept) == 1


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def _db_error(sqlstate: str):
    from django.db import OperationalError

    error = OperationalError(f"sqlstate {sqlstate}")
    error.__cause__ = _PgError(sqlstate)  # as Django wraps psycopg's error
    return error


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_batch_chosen_as_a_deadlock_victim_is_processed_again_at_once(monkeypatch, sqlstate):
    """PostgreSQL aborts one side of a deadlock (the batch takes orchestration's lock order now, see
    test_notices_lock_order; this is the safety net for a path outside it): the batch runs again
    at once instead of waiting for the sweep, so the node's job reacts in time."""
    team = make_team()
    job = make_job(team)
    instance = running(team, job=job)
    notices_store(drafts=[draft(team, instance.provider_instance_id, "a")])
    real = processing._process_together
    attempts = []

    def deadlocked_once(notice_ids):
        attempts.append(list(notice_ids))
        if len(attempts) == 1:
            raise _db_error(sqlstate)
        return real(notice_ids)

    monkeypatch.setattr(processing, "_process_together", deadlocked_once)
    assert notices_drain().processed == 1
    assert len(attempts) == 2
    instance.refresh_from_db()
    assert instance.state == "notice" and Reconfiguration.objects.filter(job=job).count() == 1


def test_other_database_errors_are_not_retried(monkeypatch):
    team = make_team()
    instance = running(team, job=make_job(team))
    notices_store(drafts=[draft(team, instance.provider_instance_id, "a")])
    attempts = []

    def broken(notice_ids):
        attempts.append(notice_ids)
        raise _db_error("23505")

    monkeypatch.setattr(processing, "_process_together", broken)
    result = notices_drain()
    assert (result.processed, result.failed) == (0, 1) and len(attempts) == 1
    assert "sqlstate 23505" in InterruptionNotice.objects.get().error
