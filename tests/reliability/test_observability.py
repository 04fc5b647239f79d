"""/metrics (Prometheus, computed from the database), /healthz, and the JSON log formatter."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.billing.models import BillingSegment
from controlplane.fleet.models import InterruptionNotice
from controlplane.jobs.models import JobGeneration, MetricSample, Reconfiguration
from controlplane.observability import health
from controlplane.observability.logs import ContextFilter, JsonFormatter, log_context
from tests.controlplane.factories import make_instance, make_job, make_team

pytestmark = pytest.mark.django_db


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _scrape(client: Client | None = None, **extra) -> dict:
    response = (client or Client()).get("/metrics", REMOTE_ADDR="127.0.0.1", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return _samples(response.content.decode())


def _notice(team, instance, n: int, *, received_at, status="received", source="aws_eventbridge"):
    return InterruptionNotice.objects.create(
        team=team, source=source, kind="interruption", dedup_key=f"obs-{n}", provider_instance_id=f"i-obs-{n}",
        instance=instance, received_at=received_at, status=status,
    )


def test_metrics_from_the_database(monkeypatch):
    monkeypatch.delenv("SPOTPIPE_METRICS_TOKEN", raising=False)
    now = timezone.now()
    team = make_team()
    job = make_job(team, status="running")
    running = make_instance(team, job=job, state="running")
    make_instance(team, job=job, state="notice")
    make_instance(team, state="terminated")
    # Two notices led to generations 1.5 s and 40 s later; a third has not (yet).
    fast = _notice(team, running, 1, received_at=now - timedelta(seconds=100), status="processed")
    slow = _notice(team, running, 2, received_at=now - timedelta(seconds=90), status="processed")
    _notice(team, running, 3, received_at=now, source="gcp")
    for number, (notice, delay) in enumerate([(fast, 1.5), (slow, 40.0)], start=1):
        JobGeneration.objects.create(job=job, number=number, created_at=notice.received_at + timedelta(seconds=delay))
        Reconfiguration.objects.create(job=job, trigger="notice", trigger_key=f"n{number}", strategy="recycle",
                                       decision="reroute", notice=notice, from_generation=number - 1,
                                       to_generation=number, decided_at=notice.received_at)
    Reconfiguration.objects.create(job=job, trigger="notice", trigger_key="n3", strategy="checkpoint",
                                   decision="restart", decided_at=now)
    MetricSample.objects.create(job=job, step=1, at=now - timedelta(seconds=5), samples_per_s=100.0)
    MetricSample.objects.create(job=job, step=2, at=now - timedelta(seconds=1), samples_per_s=250.0)
    BillingSegment.objects.create(instance=running, team=team, job=job, start=now, price_per_hour=Decimal("0.9"),
                                  price_source="spot")
    BillingSegment.objects.create(instance=running, team=team, job=job, start=now - timedelta(hours=2),
                                  end=now - timedelta(hours=1), price_per_hour=Decimal("5"), price_source="spot")

    m = _scrape()
    assert m[("spotpipe_notices_received_total", (("source", "aws_eventbridge"),))] == 2
    assert m[("spotpipe_notices_received_total", (("source", "gcp"),))] == 1
    assert m[("spotpipe_notices_processed_total", (("source", "aws_eventbridge"),))] == 2
    assert m[("spotpipe_notices", (("status", "received"),))] == 1
    h = "spotpipe_notice_to_generation_seconds"
    assert m[(f"{h}_count", ())] == 2 and m[(f"{h}_sum", ())] == pytest.approx(41.5)
    assert m[(f"{h}_bucket", (("le", "1.0"),))] == 0
    assert m[(f"{h}_bucket", (("le", "2.0"),))] == 1
    assert m[(f"{h}_bucket", (("le", "30.0"),))] == 1
    assert m[(f"{h}_bucket", (("le", "60.0"),))] == 2
    assert m[(f"{h}_bucket", (("le", "+Inf"),))] == 2
    assert m[("spotpipe_reconfigurations_total", (("decision", "reroute"), ("strategy", "recycle")))] == 2
    assert m[("spotpipe_reconfigurations_total", (("decision", "restart"), ("strategy", "checkpoint")))] == 1
    assert m[("spotpipe_instances", (("state", "running"),))] == 1
    assert m[("spotpipe_instances", (("state", "notice"),))] == 1
    assert m[("spotpipe_instances", (("state", "terminated"),))] == 1
    assert m[("spotpipe_instances", (("state", "pending"),))] == 0
    assert m[("spotpipe_job_samples_per_second", (("job_id", str(job.pk)),))] == 250.0
    assert m[("spotpipe_samples_per_second", ())] == 250.0
    assert m[("spotpipe_spend_rate_usd_per_hour", ())] == pytest.approx(0.9)
    assert m[("spotpipe_jobs", (("status", "running"),))] == 1


def test_metrics_token(monkeypatch):
    monkeypatch.setenv("SPOTPIPE_METRICS_TOKEN", "s3cret-scrape")
    client = Client()
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401  # a token set: loopback too
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape", REMOTE_ADDR="10.1.2.3")
    assert ok.status_code == 200 and b"spotpipe_instances" in ok.content
    monkeypatch.delenv("SPOTPIPE_METRICS_TOKEN")
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 401  # unset: loopback only
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_healthz_ok_and_naming_the_failing_part(monkeypatch):
    monkeypatch.setitem(health.CHECKS, "workers",
                       lambda: health.Check(ok=True, latency_ms=1.0, detail="1 worker(s)"))
    ok = Client().get("/healthz")
    assert ok.status_code == 200, ok.content
    body = ok.json()
    assert body["status"] == "ok" and body["failing"] == []
    assert body["checks"]["database"]["ok"] and body["checks"]["database"]["latency_ms"] >= 0
    assert body["checks"]["broker"]["ok"]

    def no_workers():
        return health.Check(ok=False, latency_ms=1000.0, detail="no Celery worker answered a ping")

    monkeypatch.setitem(health.CHECKS, "workers", no_workers)
    down = Client().get("/healthz")
    assert down.status_code == 503 and down.json()["failing"] == ["workers"]


def test_healthz_broker_down_is_bounded_and_hides_the_url(settings):
    """An unreachable broker fails fast (no retry loop), the workers are not pinged, and the
    broker URL (which may hold a password) is not echoed."""
    settings.CELERY_BROKER_URL = "redis://:hunter2pass@127.0.0.1:1/0"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert "broker" in body["failing"] and "workers" in body["failing"]
    assert body["checks"]["workers"]["detail"] == "broker unreachable"
    assert body["checks"]["broker"]["latency_ms"] < 5000
    assert "hunter2pass" not in response.content.decode()


def test_real_worker_check_reports_no_worker():
    """The real ping against a broker nobody consumes from: not ok, within its timeout."""
    from celery import Celery

    probe = Celery("probe", broker="memory://")
    check = health.check_workers(app=probe)
    assert not check.ok and "no Celery worker" in check.detail
    assert check.latency_ms < 5000


def test_json_logs_carry_job_and_instance_ids():
    record_out: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            record_out.append(self.format(record))

    handler = Capture()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("spotpipe.test.structured")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with log_context(job_id=7, instance_id=42):
            logger.info("generation %d published", 3)
            with log_context(notice_id=9):
                logger.warning("notice for %s", "i-abc")
        logger.info("outside, token sp_abcdefghijklmnop and Authorization: Token sp_qwertyuiopasdf")
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("failed", extra={"job_id": 8})
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in record_out]
    assert lines[0]["message"] == "generation 3 published"
    assert lines[0]["job_id"] == 7 and lines[0]["instance_id"] == 42 and lines[0]["level"] == "INFO"
    assert lines[0]["time"].endswith("+00:00")
    assert lines[1]["notice_id"] == 9 and lines[1]["job_id"] == 7
    assert "job_id" not in lines[2] and "sp_abcdefghijklmnop" not in lines[2]["message"]
    assert "sp_qwertyuiopasdf" not in lines[2]["message"]
    assert lines[3]["job_id"] == 8 and "ValueError: bad" in lines[3]["exception"]


def test_logging_config_for_settings_is_valid():
    """The LOGGING dict documented in docs/reliability.md configures without error."""
    import logging.config

    from controlplane.observability.logs import LOGGING_JSON

    logging.config.dictConfig(LOGGING_JSON)
    root = logging.getLogger()
    try:
        assert any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    finally:
        from django.conf import settings

        logging.config.dictConfig(settings.LOGGING)


def test_request_log_lines_carry_the_url_ids(caplog, settings):
    from controlplane.observability.logs import current_context

    seen: list[dict] = []
    assert "controlplane.observability.logs.LogContextMiddleware" in settings.MIDDLEWARE
    from tests.reliability.world import make_world

    world = make_world()
    from controlplane.jobs.api import views as job_views

    original = job_views.JobViewSet.retrieve

    def spy(self, request, *args, **kwargs):
        seen.append(current_context())
        return original(self, request, *args, **kwargs)

    job_views.JobViewSet.retrieve = spy
    try:
        assert world.api_client("member_a").get(f"/api/v1/jobs/{world.job.pk}/").status_code == 200
        assert world.session_client("member_a").get(f"/jobs/{world.job.pk}/").status_code == 200
    finally:
        job_views.JobViewSet.retrieve = original
    assert seen == [{"job_id": str(world.job.pk)}]
    assert current_context() == {}  # nothing leaks past the request


def test_celery_tasks_bind_their_ids():
    from celery.signals import task_postrun, task_prerun

    from controlplane.observability.logs import current_context

    class FakeTask:
        name = "fleet.process_notice"

    task_prerun.send(sender=FakeTask, task_id="t1", task=FakeTask(), args=(), kwargs={"notice_id": 5, "x": 1})
    assert current_context() == {"notice_id": 5, "task": "fleet.process_notice"}
    task_postrun.send(sender=FakeTask, task_id="t1", task=FakeTask(), args=(), kwargs={})
    assert current_context() == {}
