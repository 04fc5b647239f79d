"""/healthz exposure (issue 21): anyone gets a bare liveness answer and never exception text; the
checks and their details are for operators (SPOTPIPE_METRICS_TOKEN as a bearer token, or loopback
when no token is configured), as /metrics is."""

from __future__ import annotations

import pytest
from django.test import Client

from controlplane.observability import health

pytestmark = pytest.mark.django_db

SECRETISH = "OperationalError: could not connect to server at 10.0.7.3:5432 as user spotpipe_admin"
OUTSIDER = "203.0.113.9"


@pytest.fixture
def failing_database(monkeypatch):
    """A database check that fails with exception text worth hiding, and a worker check that
    records whether anyone ran it."""
    ran: list[str] = []

    def database():
        ran.append("database")
        return health.Check(ok=False, latency_ms=3.0, detail=SECRETISH)

    monkeypatch.setitem(health.CHECKS, "database", database)
    monkeypatch.setitem(health.CHECKS, "workers", lambda: health.Check(ok=True, latency_ms=1.0, detail="1 worker(s)"))
    return ran


def test_anonymous_callers_get_a_bare_liveness_answer(failing_database, monkeypatch):
    monkeypatch.delenv("SPOTPIPE_METRICS_TOKEN", raising=False)
    response = Client(REMOTE_ADDR=OUTSIDER).get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "10.0.7.3" not in response.content.decode()
    assert failing_database == []  # no checks run for them: nothing to learn, nothing to load


def test_operators_get_the_checks_with_a_token(failing_database, monkeypatch):
    monkeypatch.setenv("SPOTPIPE_METRICS_TOKEN", "s3cret-health")
    outsider = Client(REMOTE_ADDR=OUTSIDER)
    assert outsider.get("/healthz").json() == {"status": "ok"}
    wrong = outsider.get("/healthz", headers={"Authorization": "Bearer nope"})
    assert wrong.json() == {"status": "ok"}
    operator = outsider.get("/healthz", headers={"Authorization": "Bearer s3cret-health"})
    assert operator.status_code == 503
    assert operator.json()["failing"] == ["database"] and operator.json()["checks"]["database"]["detail"] == SECRETISH
    # With a token configured, loopback alone is not enough (a reverse proxy on the host is loopback).
    assert Client(REMOTE_ADDR="127.0.0.1").get("/healthz").json() == {"status": "ok"}


def test_loopback_gets_the_checks_when_no_token_is_configured(failing_database, monkeypatch):
    monkeypatch.delenv("SPOTPIPE_METRICS_TOKEN", raising=False)
    response = Client(REMOTE_ADDR="127.0.0.1").get("/healthz")
    assert response.status_code == 503 and response.json()["failing"] == ["database"]
