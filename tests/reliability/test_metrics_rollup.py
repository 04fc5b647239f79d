"""The metrics roll-up: a scrape that reads folded counts plus the rows past the watermark answers
exactly what counting every row answers, whatever was folded, pending or changed since."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.fleet.models import Instance, InterruptionNotice, NoticeStatus
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobGeneration, Reconfiguration
from controlplane.observability import rollup
from controlplane.observability.metrics import render
from controlplane.observability.models import MetricsLedger, MetricsPending
from controlplane.observability.rollup import LATENCY_BUCKETS, metrics_rollup_rebuild, metrics_rollup_refresh
from tests.controlplane.factories import make_instance, make_job, make_team

pytestmark = pytest.mark.django_db

HISTORY = ("spotpipe_notices_received_total", "spotpipe_notices_processed_total", "spotpipe_notices",
           "spotpipe_notice_to_generation_seconds", "spotpipe_reconfigurations_total", "spotpipe_instances")
SOURCES = ("aws_eventbridge", "aws_sns", "gcp", "azure")
STRATEGIES = (("recycle", "reroute"), ("bamboo", "takeover"), ("checkpoint", "restart"), ("oobleck", ""))
_n = itertools.count(1)


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name.startswith(HISTORY):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _expected() -> dict[tuple[str, tuple], float]:
    """Every history metric counted by hand from every row (independent of the roll-up's code)."""
    out: dict[tuple[str, tuple], float] = {}

    def add(name: str, labels: dict, n: float = 1) -> None:
        key = (name, tuple(sorted(labels.items())))
        out[key] = out.get(key, 0) + n

    for status in NoticeStatus.values:
        add("spotpipe_notices", {"status": status}, 0)
    for state in InstanceState.values:
        add("spotpipe_instances", {"state": state}, 0)
    for notice in InterruptionNotice.objects.all():
        add("spotpipe_notices_received_total", {"source": notice.source})
        add("spotpipe_notices", {"status": notice.status})
        if notice.status == NoticeStatus.PROCESSED:
            add("spotpipe_notices_processed_total", {"source": notice.source})
    for instance in Instance.objects.all():
        add("spotpipe_instances", {"state": instance.state})
    latencies = []
    for r in Reconfiguration.objects.select_related("notice"):
        add("spotpipe_reconfigurations_total", {"strategy": r.strategy, "decision": r.decision or "none"})
        generation = JobGeneration.objects.filter(job_id=r.job_id, number=r.to_generation).first()
        if r.notice is not None and generation is not None:
            latencies.append(max((generation.created_at - r.notice.received_at).total_seconds(), 0.0))
    h = "spotpipe_notice_to_generation_seconds"
    for bound in LATENCY_BUCKETS:
        add(f"{h}_bucket", {"le": repr(float(bound))}, sum(1 for v in latencies if v <= bound))
    add(f"{h}_bucket", {"le": "+Inf"}, len(latencies))
    add(f"{h}_count", {}, len(latencies))
    add(f"{h}_sum", {}, sum(latencies))
    return out


def _assert_scrape_is_full_recount() -> None:
    got, want = _samples(render()), _expected()
    h_sum = ("spotpipe_notice_to_generation_seconds_sum", ())
    assert got.pop(h_sum) == pytest.approx(want.pop(h_sum), abs=1e-6)
    assert got == want
    # The benchmark's baseline (every row recounted by the collector) is the same text.
    assert render() == render(recount=True)


class World:
    def __init__(self) -> None:
        self.team = make_team()
        self.job = make_job(self.team, status="running")
        self.generation = 0
        self.now = timezone.now()

    def notice(self, *, status: str, source: str = "aws_eventbridge", instance: Instance | None = None):
        n = next(_n)
        return InterruptionNotice.objects.create(
            team=self.team, source=source, kind="interruption", dedup_key=f"roll-{n}", provider_instance_id=f"i-r{n}",
            instance=instance, received_at=self.now - timedelta(seconds=1000 - n), status=status,
        )

    def reconfiguration(self, notice, *, strategy: str, decision: str, delay: float | None, status: str = "applied"):
        """A notice-triggered reconfiguration; with `delay`, the generation it produced that much later."""
        to_generation = None
        if delay is not None:
            self.generation += 1
            to_generation = self.generation
            JobGeneration.objects.create(job=self.job, number=to_generation,
                                         created_at=notice.received_at + timedelta(seconds=delay))
        return Reconfiguration.objects.create(
            job=self.job, trigger="notice", trigger_key=f"k{next(_n)}", strategy=strategy, decision=decision,
            notice=notice, from_generation=None, to_generation=to_generation, status=status,
            decided_at=notice.received_at,
        )

    def history(self, count: int, *, settled: bool) -> list:
        """`count` notices, each with its instance and reconfiguration; settled (processed, terminated,
        applied) or a mix of in-flight states."""
        made = []
        notice_statuses = ["processed"] if settled else ["received", "enqueued", "failed", "processed"]
        instance_states = ["terminated", "preempted"] if settled else ["running", "notice", "pending", "failed"]
        for k in range(count):
            instance = make_instance(self.team, job=self.job, state=instance_states[k % len(instance_states)])
            notice = self.notice(status=notice_statuses[k % len(notice_statuses)], source=SOURCES[k % len(SOURCES)],
                                 instance=instance)
            strategy, decision = STRATEGIES[k % len(STRATEGIES)]
            delay = [0.1, 0.7, 1.5, 4.0, 40.0, 700.0, None][k % 7]
            status = "applied" if settled or k % 3 else "decided"
            made.append((notice, instance, self.reconfiguration(notice, strategy=strategy, decision=decision,
                                                                delay=delay, status=status)))
        return made


@pytest.fixture
def no_lag(monkeypatch):
    """Refreshes back to back fold what the previous one saw (beat's are a period apart)."""
    monkeypatch.setattr(rollup, "MIN_LAG_S", 0.0)


def test_partial_rollup_answers_the_full_recount(monkeypatch, no_lag):
    monkeypatch.setattr(rollup, "FOLD_CHUNK", 4)  # several fold transactions per refresh
    world = World()
    world.history(9, settled=True)
    in_flight = world.history(8, settled=False)
    _assert_scrape_is_full_recount()  # nothing folded yet: everything is live

    assert metrics_rollup_refresh() == {"notice": 0, "instance": 0, "reconfiguration": 0}  # sees the tops only
    moved = metrics_rollup_refresh()  # folds up to what the previous run saw
    assert moved == {"notice": 17, "instance": 17, "reconfiguration": 17}
    assert MetricsPending.objects.filter(ledger="notice").count() == 6  # received, enqueued, failed ones
    _assert_scrape_is_full_recount()

    # Rows past the watermark, and pending rows that moved on since (some to settled states).
    world.history(5, settled=True)
    world.history(6, settled=False)
    for notice, instance, reconf in in_flight[:4]:
        notice.status = NoticeStatus.PROCESSED
        notice.save(update_fields=["status"])
        if instance.state != "failed":
            instance.state = "terminated"
            instance.save(update_fields=["state"])
        if reconf.status == "decided":
            reconf.status, reconf.decision = "applied", "reinstantiate"
            reconf.save(update_fields=["status", "decision"])
    in_flight[5][0].status = NoticeStatus.FAILED
    in_flight[5][0].save(update_fields=["status"])
    _assert_scrape_is_full_recount()

    metrics_rollup_refresh()  # folds the settled pending rows; the new rows stay live (lag)
    _assert_scrape_is_full_recount()
    metrics_rollup_refresh()
    assert MetricsLedger.objects.get(name="notice").folded_to == InterruptionNotice.objects.order_by("-id")[0].id
    _assert_scrape_is_full_recount()

    # A failed notice retried by an operator goes back to received: still counted right.
    in_flight[5][0].status = NoticeStatus.RECEIVED
    in_flight[5][0].save(update_fields=["status"])
    metrics_rollup_refresh()
    _assert_scrape_is_full_recount()

    # A pending row deleted (a live instance): forgotten by the next refresh, counted by neither side.
    gone = in_flight[4][1]
    assert MetricsPending.objects.filter(ledger="instance", row_id=gone.pk).exists()
    gone.delete()
    _assert_scrape_is_full_recount()
    metrics_rollup_refresh()
    assert not MetricsPending.objects.filter(ledger="instance", row_id=gone.pk).exists()
    _assert_scrape_is_full_recount()

    metrics_rollup_rebuild()
    _assert_scrape_is_full_recount()
    metrics_rollup_refresh(lagged=False)
    _assert_scrape_is_full_recount()


def test_a_refresh_committing_during_a_scrape_is_not_counted_twice(monkeypatch, no_lag):
    world = World()
    world.history(6, settled=True)
    world.history(4, settled=False)
    metrics_rollup_refresh()
    world.history(3, settled=True)
    folded = rollup._folded
    calls = []

    def refresh_then_folded():
        if not calls:  # the roll-up commits after the scrape read the watermarks, before the counts
            metrics_rollup_refresh(lagged=False)
        calls.append(1)
        return folded()

    monkeypatch.setattr(rollup, "_folded", refresh_then_folded)
    _assert_scrape_is_full_recount()
    assert len(calls) >= 2  # the scrape saw the versions change and read again


def test_a_refresh_folds_only_ids_seen_long_enough_ago(monkeypatch):
    """Ids seen by a refresh less than MIN_LAG_S ago are not folded yet (a row with a smaller id may
    still be committing), nor replaced by newer ones; pending rows are folded every time."""
    world = World()
    world.history(3, settled=True)
    pending = world.history(1, settled=False)
    assert metrics_rollup_refresh() == {"notice": 0, "instance": 0, "reconfiguration": 0}
    seen = MetricsLedger.objects.get(name="notice").seen_top
    world.history(2, settled=True)
    assert metrics_rollup_refresh() == {"notice": 0, "instance": 0, "reconfiguration": 0}  # too soon
    assert MetricsLedger.objects.get(name="notice").seen_top == seen
    _assert_scrape_is_full_recount()
    monkeypatch.setattr(rollup, "MIN_LAG_S", 0.0)
    assert metrics_rollup_refresh() == {"notice": 4, "instance": 4, "reconfiguration": 4}
    assert MetricsLedger.objects.get(name="notice").folded_to == seen
    notice = pending[0][0]
    notice.status = NoticeStatus.PROCESSED
    notice.save(update_fields=["status"])
    monkeypatch.setattr(rollup, "MIN_LAG_S", 3600.0)
    metrics_rollup_refresh()  # not ripe: the watermark stays, the settled pending notice is folded
    assert not MetricsPending.objects.filter(ledger="notice", row_id=notice.pk).exists()
    assert MetricsLedger.objects.get(name="notice").folded_to == seen
    _assert_scrape_is_full_recount()


def test_the_beat_task_folds_and_is_scheduled(no_lag):
    from controlplane.beat import BEAT_SCHEDULE
    from controlplane.observability.tasks import refresh_metrics_rollup

    entry = BEAT_SCHEDULE["observability.refresh_metrics_rollup"]
    assert entry["task"] == refresh_metrics_rollup.name and entry["schedule"] == 60.0
    World().history(3, settled=True)
    assert refresh_metrics_rollup.apply().get() == {"notice": 0, "instance": 0, "reconfiguration": 0}
    assert refresh_metrics_rollup.apply().get() == {"notice": 3, "instance": 3, "reconfiguration": 3}
    assert refresh_metrics_rollup.apply().get() == {"notice": 0, "instance": 0, "reconfiguration": 0}
    _assert_scrape_is_full_recount()


def test_the_command_folds_and_rebuilds_after_rows_are_deleted(no_lag):
    """`manage.py metrics_rollup` folds as beat does; after notices are deleted the folded gauges
    still count them, and `--rebuild` (then the refreshes) brings the scrape back to the recount."""
    from io import StringIO

    from django.core.management import call_command

    world = World()
    made = world.history(4, settled=True)
    for _ in range(2):  # the first refresh sees the ids, the second folds them
        call_command("metrics_rollup", stdout=StringIO())
    out = StringIO()
    call_command("metrics_rollup", stdout=out)
    assert "notice 0" in out.getvalue()
    _assert_scrape_is_full_recount()
    InterruptionNotice.objects.filter(pk=made[0][0].pk).delete()  # its reconfiguration goes with it
    assert _samples(render()) != _expected()  # folded counts do not go down by themselves
    out = StringIO()
    call_command("metrics_rollup", "--rebuild", stdout=out)
    assert "reset" in out.getvalue()
    call_command("metrics_rollup", stdout=StringIO())
    _assert_scrape_is_full_recount()
