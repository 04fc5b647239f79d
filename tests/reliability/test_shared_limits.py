"""Rate limits are counted in a store every process shares (issue 21: "limits kept in a shared
store"): Redis when REDIS_URL is set, files under SPOTPIPE_VAR_DIR on the embedded default. Before,
each web process counted in its own memory, so N processes allowed N times each limit."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client, override_settings

from tests.reliability.test_security import _fresh_ip

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]

# Another web process of the same deployment: its own interpreter and settings, its own copy of the
# middleware (in front of a stand-in view: the budget is spent before any view or database runs).
_OTHER_PROCESS = """
import django, json, sys
django.setup()
from django.http import HttpResponse
from django.test import RequestFactory
from controlplane.observability.ratelimit import RateLimitMiddleware
middleware = RateLimitMiddleware(lambda request: HttpResponse(status=200))
post = RequestFactory().post
print(json.dumps([middleware(post("/accounts/login/", REMOTE_ADDR=sys.argv[1])).status_code
                  for _ in range(int(sys.argv[2]))]))
"""


@pytest.fixture
def limited(monkeypatch):
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_LOGIN", "5")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WINDOW_S", "3600")  # no window boundary inside the test


def test_the_cache_is_shared_by_processes():
    backend = settings.CACHES["default"]["BACKEND"]
    expected = "RedisCache" if os.environ.get("REDIS_URL") else "FileBasedCache"
    assert backend.endswith(expected)


def test_two_processes_share_one_budget(limited):
    """Guesses from another process count against this process's budget for the same address."""
    ip = _fresh_ip()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "controlplane.settings_dev"}
    out = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, ip, "3"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [200, 200, 200]
    client = Client()
    here = [client.post("/accounts/login/", {"username": "x", "password": f"p{i}"}, REMOTE_ADDR=ip).status_code
            for i in range(4)]
    assert here == [200, 200, 429, 429]  # 3 there + 2 here = the limit of 5


@override_settings(CACHES={"default": {
    "BACKEND": "django.core.cache.backends.redis.RedisCache",
    "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
    "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
}})
def test_an_unreachable_cache_lets_requests_through_and_says_so(limited, caplog):
    """A Redis restart must not turn login (or notice intake) into 500s: uncounted, with a warning."""
    with caplog.at_level(logging.WARNING, logger="controlplane.observability.ratelimit"):
        statuses = [Client().post("/accounts/login/", {"username": "x", "password": "p"},
                                  REMOTE_ADDR=_fresh_ip()).status_code for _ in range(7)]
    assert statuses == [200] * 7
    assert "cache unreachable" in caplog.text


def test_a_count_that_vanished_lets_the_request_through(limited, monkeypatch):
    """django-ratelimit counts with add() then incr(); when the key expires in between, incr()
    raises ValueError and the count is unknown: RATELIMIT_FAIL_OPEN lets the request through
    rather than refusing it (its default would answer 429)."""
    from django.core.cache import caches

    monkeypatch.setenv("SPOTPIPE_RATELIMIT_LOGIN", "1")
    client, ip = Client(), _fresh_ip()
    assert client.post("/accounts/login/", {"username": "x", "password": "p"}, REMOTE_ADDR=ip).status_code == 200

    def vanished(*args, **kwargs):
        raise ValueError("Key not found.")

    monkeypatch.setattr(caches["default"], "incr", vanished)
    assert client.post("/accounts/login/", {"username": "x", "password": "p"}, REMOTE_ADDR=ip).status_code == 200
    monkeypatch.undo()
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_LOGIN", "1")
    monkeypatch.setenv("SPOTPIPE_RATELIMIT_WINDOW_S", "3600")
    assert client.post("/accounts/login/", {"username": "x", "password": "p"}, REMOTE_ADDR=ip).status_code == 429
