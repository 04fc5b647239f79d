"""Prometheus metrics read from the database on each scrape.

The web server, the Celery workers and beat are separate processes (maybe on several hosts);
counters kept in memory would each see only their own share (and need a push gateway or
multiprocess mode on a shared disk). Every figure here is instead read from rows the processes
already write, so any replica answers the same numbers and a restart loses nothing. What grows
with history (notices, instances, reconfigurations) is read from the metrics roll-up
(`observability.rollup`): folded counts plus the rows written since the last refresh; the rest
(jobs, running jobs' latest samples, open billing segments) is small.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

from django.db.models import Count, Max, Sum
from django.utils import timezone
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

from controlplane.billing.models import BillingSegment
from controlplane.fleet.models import NoticeStatus
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobStatus, MetricSample, TrainingJob
from controlplane.observability.rollup import INF, LATENCY_BUCKETS, Tally, current_tally, full_tally

# Job throughput is the latest sample of each running job, if not older than this.
SAMPLE_FRESHNESS = timedelta(minutes=5)


def _latency_histogram(tally: Tally) -> HistogramMetricFamily:
    bounds = [repr(float(bound)) for bound in LATENCY_BUCKETS] + [INF]
    cumulative, running, total = [], 0, 0
    for bound in bounds:
        running += tally.counts[("latency", (bound,))]
        total += tally.totals[("latency", (bound,))]
        cumulative.append((bound, running))
    return HistogramMetricFamily(
        "spotpipe_notice_to_generation_seconds",
        "Time from an interruption notice's receipt to the new generation of its job.",
        buckets=cumulative, sum_value=total / 1_000_000,
    )


def spend_rate_usd_per_hour() -> Decimal:
    """What the open billing segments (instances being paid for right now) cost per hour."""
    total = BillingSegment.objects.filter(end__isnull=True).aggregate(total=Sum("price_per_hour"))["total"]
    return total or Decimal(0)


def job_samples_per_s() -> dict[int, float]:
    """Latest reported samples/s of each running job (fresh samples only)."""
    since = timezone.now() - SAMPLE_FRESHNESS
    latest = (
        MetricSample.objects.filter(job__status=JobStatus.RUNNING, at__gte=since, samples_per_s__isnull=False)
        .values("job_id")
        .annotate(last_at=Max("at"))
    )
    out: dict[int, float] = {}
    for row in latest:
        sample = (
            MetricSample.objects.filter(job_id=row["job_id"], at=row["last_at"], samples_per_s__isnull=False)
            .values_list("samples_per_s", flat=True)
            .first()
        )
        if sample is not None:
            out[row["job_id"]] = float(sample)
    return out


def _family(tally: Tally, name: str) -> dict[tuple[str, ...], int]:
    return {labels: n for (family, labels), n in tally.counts.items() if family == name and n}


def _history_metrics(tally: Tally) -> Iterator[Metric]:
    """The families counted over history, from a tally of every notice, instance and reconfiguration."""
    notices = _family(tally, "notice")
    received = CounterMetricFamily(
        "spotpipe_notices_received", "Interruption notices received, by source.", labels=["source"]
    )
    processed = CounterMetricFamily(
        "spotpipe_notices_processed", "Interruption notices processed by a worker, by source.", labels=["source"]
    )
    by_source: dict[str, int] = {}
    processed_by_source: dict[str, int] = {}
    by_status: dict[str, int] = {}
    for (source, status), n in notices.items():
        by_source[source] = by_source.get(source, 0) + n
        by_status[status] = by_status.get(status, 0) + n
        if status == NoticeStatus.PROCESSED:
            processed_by_source[source] = processed_by_source.get(source, 0) + n
    for source in sorted(by_source):
        received.add_metric([source], by_source[source])
    for source in sorted(processed_by_source):
        processed.add_metric([source], processed_by_source[source])
    yield received
    yield processed

    gauge = GaugeMetricFamily("spotpipe_notices", "Interruption notices by status.", labels=["status"])
    for status in NoticeStatus.values:
        gauge.add_metric([status], by_status.get(status, 0))
    yield gauge

    yield _latency_histogram(tally)

    reconf = CounterMetricFamily(
        "spotpipe_reconfigurations",
        "Reconfigurations decided, by strategy and decision.",
        labels=["strategy", "decision"],
    )
    for (strategy, decision), n in sorted(_family(tally, "reconfiguration").items()):
        reconf.add_metric([strategy, decision or "none"], n)
    yield reconf

    instances = GaugeMetricFamily("spotpipe_instances", "Instances by state.", labels=["state"])
    states = {labels[0]: n for labels, n in _family(tally, "instance").items()}
    for state in InstanceState.values:
        instances.add_metric([state], states.get(state, 0))
    yield instances


def _current_metrics() -> Iterator[Metric]:
    """The families of what is true now, read from small sets of rows (jobs, running jobs' latest
    samples, open billing segments)."""
    jobs = GaugeMetricFamily("spotpipe_jobs", "Training jobs by status.", labels=["status"])
    counts = dict(TrainingJob.objects.values_list("status").annotate(n=Count("id")).order_by())
    for status in JobStatus.values:
        jobs.add_metric([status], counts.get(status, 0))
    yield jobs

    samples = GaugeMetricFamily(
        "spotpipe_job_samples_per_second", "Latest training throughput of each running job.", labels=["job_id"]
    )
    per_job = job_samples_per_s()
    for job_id, rate in sorted(per_job.items()):
        samples.add_metric([str(job_id)], rate)
    yield samples
    yield GaugeMetricFamily(
        "spotpipe_samples_per_second", "Training throughput summed over running jobs.", value=sum(per_job.values())
    )

    yield GaugeMetricFamily(
        "spotpipe_spend_rate_usd_per_hour",
        "Hourly price of the instances being paid for now (open billing segments).",
        value=float(spend_rate_usd_per_hour()),
    )


class DatabaseCollector:
    """A prometheus_client collector whose every sample is a database read at scrape time.
    `recount`: count the history's every row instead of reading the roll-up (the figures are the
    same; the cost grows with history): the benchmark's baseline and the tests' reference."""

    def __init__(self, *, recount: bool = False) -> None:
        self.recount = recount

    def collect(self) -> Iterator[Metric]:
        yield from _history_metrics(full_tally() if self.recount else current_tally())
        yield from _current_metrics()


def render(*, recount: bool = False) -> bytes:
    """The exposition text of a fresh registry holding only the database collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(recount=recount))
    return generate_latest(registry)


def full_recount_render() -> bytes:
    """`render()` with every figure counted from every row (the endpoint before the roll-up)."""
    return render(recount=True)
