"""Prometheus metrics computed from the database on each scrape.

The web server, the Celery workers and beat are separate processes; counters kept in memory would
each see only their own share (and need a push gateway or multiprocess mode). Every figure here is
instead read from rows the processes already write, so any replica answers the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

from django.db.models import Count, F, Max, OuterRef, Subquery, Sum
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
from controlplane.fleet.models import Instance, InterruptionNotice, NoticeStatus
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobGeneration, JobStatus, MetricSample, Reconfiguration, TrainingJob

# Notice -> new generation, seconds. Reconfiguration target is a few seconds (ARCHITECTURE.md).
LATENCY_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
# Job throughput is the latest sample of each running job, if not older than this.
SAMPLE_FRESHNESS = timedelta(minutes=5)


def notice_latencies() -> list[float]:
    """Seconds from each notice's receipt to the creation of the generation its reconfiguration
    produced (notices that have not led to a new generation are left out)."""
    generation_at = JobGeneration.objects.filter(
        job_id=OuterRef("job_id"), number=OuterRef("to_generation")
    ).values("created_at")[:1]
    rows = (
        Reconfiguration.objects.filter(notice__isnull=False, to_generation__isnull=False)
        .annotate(generation_at=Subquery(generation_at), received_at=F("notice__received_at"))
        .exclude(generation_at__isnull=True)
        .values_list("received_at", "generation_at")
    )
    return [max((generated - received).total_seconds(), 0.0) for received, generated in rows]


def _histogram(name: str, doc: str, values: list[float], buckets: tuple[float, ...]) -> HistogramMetricFamily:
    cumulative = []
    for bound in buckets:
        cumulative.append((repr(float(bound)), sum(1 for v in values if v <= bound)))
    cumulative.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=sum(values))


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


class DatabaseCollector:
    """A prometheus_client collector whose every sample is a database read at scrape time."""

    def collect(self) -> Iterator[Metric]:
        received = CounterMetricFamily(
            "spotpipe_notices_received", "Interruption notices received, by source.", labels=["source"]
        )
        for row in InterruptionNotice.objects.values("source").annotate(n=Count("id")).order_by("source"):
            received.add_metric([row["source"]], row["n"])
        yield received

        processed = CounterMetricFamily(
            "spotpipe_notices_processed", "Interruption notices processed by a worker, by source.", labels=["source"]
        )
        rows = (
            InterruptionNotice.objects.filter(status=NoticeStatus.PROCESSED)
            .values("source").annotate(n=Count("id")).order_by("source")
        )
        for row in rows:
            processed.add_metric([row["source"]], row["n"])
        yield processed

        by_status = GaugeMetricFamily("spotpipe_notices", "Interruption notices by status.", labels=["status"])
        counts = dict(InterruptionNotice.objects.values_list("status").annotate(n=Count("id")).order_by())
        for status in NoticeStatus.values:
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status

        yield _histogram(
            "spotpipe_notice_to_generation_seconds",
            "Time from an interruption notice's receipt to the new generation of its job.",
            notice_latencies(),
            LATENCY_BUCKETS,
        )

        reconf = CounterMetricFamily(
            "spotpipe_reconfigurations",
            "Reconfigurations decided, by strategy and decision.",
            labels=["strategy", "decision"],
        )
        rows = Reconfiguration.objects.values("strategy", "decision").annotate(n=Count("id")).order_by()
        for row in rows:
            reconf.add_metric([row["strategy"], row["decision"] or "none"], row["n"])
        yield reconf

        instances = GaugeMetricFamily("spotpipe_instances", "Instances by state.", labels=["state"])
        counts = dict(Instance.objects.values_list("state").annotate(n=Count("id")).order_by())
        for state in InstanceState.values:
            instances.add_metric([state], counts.get(state, 0))
        yield instances

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


def render() -> bytes:
    """The exposition text of a fresh registry holding only the database collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry)
