"""The metrics roll-up: what `/metrics` counts over history, folded once instead of on every scrape.

Three ledgers (tables the metrics count) grow with the fleet's history: interruption notices,
instances and reconfigurations. Each row is tallied into (family, labels) counts by one function
per ledger (`tally_notices`, ...); the tallies add over disjoint sets of rows. A periodic refresh
(`metrics_rollup_refresh`, beat's `observability.refresh_metrics_rollup`) folds the rows above a
per-ledger id watermark into `MetricsCount`: a row that is settled (it can no longer change what it
adds: a processed notice, an instance in a terminal state, an applied or failed reconfiguration) is
added to the counts; one that is not is remembered in `MetricsPending` and counted live until a later
refresh finds it settled. A scrape (`current_tally`) is then the folded counts plus the tally of the
rows past the watermark and the pending rows, both read by primary key: its cost follows the rows
written since the last refresh and the rows still in flight, not the history.

Ids are handed out at insert and rows commit in any order, so a refresh folds only up to the largest
id the previous refresh saw (`seen_top`), one period and at least MIN_LAG_S earlier: a row whose
inserting transaction stays open longer than that would be missed (no transaction of the control
plane stays open for seconds). `metrics_rollup_rebuild` starts over (after rows were deleted, or when
`LATENCY_BUCKETS` change)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import models, transaction
from django.db.models import Count, F, Max, OuterRef, Q, Subquery
from django.utils import timezone

from controlplane.fleet.models import Instance, InterruptionNotice, NoticeStatus
from controlplane.fleet.states import TERMINAL_STATES
from controlplane.jobs.models import JobGeneration, Reconfiguration, ReconfigurationStatus
from controlplane.observability.models import MetricsCount, MetricsLedger, MetricsPending

# Notice -> new generation, seconds. Reconfiguration target is a few seconds (ARCHITECTURE.md).
# Folded as per-bucket counts: changing the bounds needs `metrics_rollup_rebuild`.
LATENCY_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
INF = "+Inf"
# Ids folded per transaction: a first refresh over a year of history commits in steps.
FOLD_CHUNK = 50_000
# A lagged refresh folds up to the ids the previous one saw only if that was at least this long ago
# (beat may run two refreshes back to back after a backlog): no transaction here stays open as long.
MIN_LAG_S = 10.0
SCRAPE_RETRIES = 3

Key = tuple[str, tuple[str, ...]]


@dataclass
class Tally:
    """Counts (and integer sums) per (family, labels). Families: `notice` (source, status),
    `instance` (state,), `reconfiguration` (strategy, decision), `latency` (bucket upper bound,):
    the non-cumulative count of latencies in that bucket, with their sum in microseconds."""

    counts: Counter = field(default_factory=Counter)
    totals: Counter = field(default_factory=Counter)

    def __iadd__(self, other: Tally) -> Tally:
        self.counts.update(other.counts)
        self.totals.update(other.totals)
        return self


def _latency_bucket(micros: int) -> str:
    for bound in LATENCY_BUCKETS:
        if micros <= round(bound * 1_000_000):
            return repr(float(bound))
    return INF


def tally_notices(rows: models.QuerySet) -> Tally:
    out = Tally()
    for source, status, n in rows.values_list("source", "status").annotate(n=Count("id")).order_by():
        out.counts[("notice", (source, status))] += n
    return out


def tally_instances(rows: models.QuerySet) -> Tally:
    out = Tally()
    for state, n in rows.values_list("state").annotate(n=Count("id")).order_by():
        out.counts[("instance", (state,))] += n
    return out


def tally_reconfigurations(rows: models.QuerySet) -> Tally:
    """Decisions by (strategy, decision), and the seconds from each notice's receipt to the creation
    of the generation its reconfiguration produced (left out until that generation exists)."""
    out = Tally()
    for strategy, decision, n in rows.values_list("strategy", "decision").annotate(n=Count("id")).order_by():
        out.counts[("reconfiguration", (strategy, decision))] += n
    generation_at = JobGeneration.objects.filter(
        job_id=OuterRef("job_id"), number=OuterRef("to_generation")
    ).values("created_at")[:1]
    timed = (
        rows.filter(notice__isnull=False, to_generation__isnull=False)
        .annotate(generation_at=Subquery(generation_at), received_at=F("notice__received_at"))
        .exclude(generation_at__isnull=True)
        .values_list("received_at", "generation_at")
        .order_by()
    )
    for received, generated in timed:  # at most FOLD_CHUNK rows (a fold) or the live rows (a scrape)
        micros = max((generated - received) // timedelta(microseconds=1), 0)
        key = ("latency", (_latency_bucket(micros),))
        out.counts[key] += 1
        out.totals[key] += micros
    return out


@dataclass(frozen=True)
class Ledger:
    name: str
    model: type[models.Model]
    settled: Q  # rows that can no longer change what they add to the tally
    tally: Callable[[models.QuerySet], Tally]


LEDGERS: tuple[Ledger, ...] = (
    Ledger("notice", InterruptionNotice, Q(status=NoticeStatus.PROCESSED), tally_notices),
    Ledger("instance", Instance, Q(state__in=TERMINAL_STATES), tally_instances),
    Ledger("reconfiguration", Reconfiguration, ~Q(status=ReconfigurationStatus.DECIDED), tally_reconfigurations),
)


def full_tally() -> Tally:
    """Every row of every ledger counted now (what each scrape did before the roll-up)."""
    out = Tally()
    for ledger in LEDGERS:
        out += ledger.tally(ledger.model.objects.all())
    return out


def _folded() -> Tally:
    out = Tally()
    for family, labels, count, total in MetricsCount.objects.values_list("family", "labels", "count", "total"):
        key = (family, tuple(json.loads(labels)))
        out.counts[key] += count
        out.totals[key] += total
    return out


def _live(ledger: Ledger, folded_to: int) -> Tally:
    """The rows a scrape counts itself: past the watermark, and the pending ones (two indexed reads)."""
    manager = ledger.model.objects
    out = ledger.tally(manager.filter(id__gt=folded_to))
    pending = MetricsPending.objects.filter(ledger=ledger.name, row_id__lte=folded_to).values("row_id")
    out += ledger.tally(manager.filter(id__in=Subquery(pending)))
    return out


def _versions() -> dict[str, tuple[int, int]]:
    return {name: (folded_to, version)
            for name, folded_to, version in MetricsLedger.objects.values_list("name", "folded_to", "version")}


def current_tally() -> Tally:
    """The tally of every row, as the folded counts plus the live rows. A refresh that commits while
    the scrape reads (its ledger versions changed) makes the scrape read again, so a folded batch is
    never counted twice or missed."""
    for _ in range(SCRAPE_RETRIES):
        before = _versions()
        out = _folded()
        for ledger in LEDGERS:
            out += _live(ledger, before.get(ledger.name, (0, 0))[0])
        if _versions() == before:
            return out
    return out  # refreshes back to back (a first fold of a long history): this read is as good as any


def _add_counts(tally: Tally) -> None:
    """Add `tally` to the stored counts (the caller holds the ledger's lock: its families are its own)."""
    keys = {key for key in tally.counts if tally.counts[key] or tally.totals[key]}
    if not keys:
        return
    stored = {}
    wanted = Q()
    for family, labels in keys:
        wanted |= Q(family=family, labels=json.dumps(list(labels)))
    for row in MetricsCount.objects.filter(wanted):
        stored[(row.family, row.labels)] = row
    out = []
    for family, labels in keys:
        text = json.dumps(list(labels))
        row = stored.get((family, text)) or MetricsCount(family=family, labels=text)
        row.count += tally.counts[(family, labels)]
        row.total += tally.totals[(family, labels)]
        out.append(row)
    MetricsCount.objects.bulk_create(out, update_conflicts=True, unique_fields=["family", "labels"],
                                     update_fields=["count", "total"])


def _fold_pending(ledger: Ledger) -> bool:
    """Fold the pending rows that have settled since (and forget the ones deleted since)."""
    pending = MetricsPending.objects.filter(ledger=ledger.name)
    ids = list(pending.values_list("row_id", flat=True))
    if not ids:
        return False
    rows = ledger.model.objects.filter(id__in=ids)
    settled = list(rows.filter(ledger.settled).values_list("id", flat=True))
    gone = set(ids) - set(rows.values_list("id", flat=True))
    if settled:
        _add_counts(ledger.tally(ledger.model.objects.filter(id__in=settled)))
    if settled or gone:
        pending.filter(row_id__in=[*settled, *gone]).delete()
    return bool(settled or gone)


def _fold_range(ledger: Ledger, state: MetricsLedger, upto: int) -> int:
    """Fold rows in (folded_to, upto]: the unsettled ones become pending first, then the rest
    (settled when that list was read, so for good) are added to the counts. Returns the rows folded."""
    rows = ledger.model.objects.filter(id__gt=state.folded_to, id__lte=upto)
    unsettled = list(rows.exclude(ledger.settled).values_list("id", flat=True))
    MetricsPending.objects.bulk_create([MetricsPending(ledger=ledger.name, row_id=i) for i in unsettled],
                                       ignore_conflicts=True)
    tally = ledger.tally(rows.exclude(id__in=unsettled) if unsettled else rows)
    _add_counts(tally)
    state.folded_to = upto
    # Each row adds one to its ledger's own family (the family is named after the ledger).
    return len(unsettled) + sum(n for (family, _), n in tally.counts.items() if family == ledger.name)


def _state(name: str) -> MetricsLedger:
    MetricsLedger.objects.get_or_create(name=name)
    return MetricsLedger.objects.select_for_update().get(name=name)


def refresh_ledger(ledger: Ledger, *, lagged: bool = True) -> int:
    """Fold one ledger: its settled pending rows, then the rows up to the largest id the previous
    refresh saw, at least MIN_LAG_S ago (`lagged`; else up to the largest id now: tests, and a
    rebuild with writers stopped), in transactions of at most FOLD_CHUNK ids. Returns how many rows
    went past the watermark."""
    top = ledger.model.objects.aggregate(m=Max("id"))["m"] or 0
    moved = 0
    now = timezone.now()
    with transaction.atomic():
        state = _state(ledger.name)
        ripe = not lagged or state.seen_at is None or (now - state.seen_at).total_seconds() >= MIN_LAG_S
        # Not ripe: only the pending rows are looked at this time.
        upto = top if not lagged else (min(state.seen_top, top) if ripe else state.folded_to)
        changed = _fold_pending(ledger)
        step = min(upto, state.folded_to + FOLD_CHUNK)
        if step > state.folded_to:
            moved += _fold_range(ledger, state, step)
            changed = True
        if ripe:  # else the ids seen last time wait for their lag, and are not replaced by newer ones
            state.seen_top, state.seen_at = max(state.seen_top, top), now
        state.version += int(changed)
        state.save()
    while step < upto:  # a long history: the rest in transactions of its own
        with transaction.atomic():
            state = _state(ledger.name)
            step = min(upto, state.folded_to + FOLD_CHUNK)
            if step <= state.folded_to:
                break
            moved += _fold_range(ledger, state, step)
            state.version += 1
            state.save()
    return moved


def metrics_rollup_refresh(*, lagged: bool = True) -> dict[str, int]:
    """Fold every ledger; returns how many rows of each went past its watermark. Safe to run
    concurrently (each ledger's state row is locked) and twice (each row is folded once)."""
    return {ledger.name: refresh_ledger(ledger, lagged=lagged) for ledger in LEDGERS}


@transaction.atomic
def metrics_rollup_rebuild() -> None:
    """Forget the folded counts: the next refreshes fold the whole history again."""
    MetricsLedger.objects.select_for_update().all().update(folded_to=0, seen_top=0, seen_at=None,
                                                                  version=F("version") + 1)
    MetricsCount.objects.all().delete()
    MetricsPending.objects.all().delete()
