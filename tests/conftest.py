"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

# API throttles count per principal in a cache shared across tests, and ids repeat between tests
# (SQLite reuses them after a rollback): the suite's thousands of API calls would meet each other's
# counts. They are off unless a test sets a rate (tests/reliability/test_api_throttles.py); settings
# win over the environment, and servers the tests start inherit it.
os.environ.setdefault("SPOTPIPE_THROTTLE_API", "0")
os.environ.setdefault("SPOTPIPE_THROTTLE_PLANS", "0")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SPOTPIPE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

# The `backend_independent` marker: tests of the training runtime, the simulator and the planner's
# cost model (these folders of tests/) that use neither the database nor Django's settings and are
# not `runtime` tests (multi-process runs: .ci/run leaves them out by their own marker). The code
# they reach imports no Django, Celery or Redis (tests/runtime/test_backend_independent.py holds
# them to that), so the database and broker under test cannot change what they prove: CI's embedded
# pass deselects them (`-m "not backend_independent"`) and they run once, in the PostgreSQL pass.
BACKEND_INDEPENDENT_DIRS = ("runtime", "sim", "planner", "usermodels")
BACKEND_FIXTURES = frozenset({
    "db", "transactional_db", "django_db_setup", "django_db_reset_sequences", "django_db_serialized_rollback",
    "settings", "client", "async_client", "admin_client", "admin_user", "django_user_model", "live_server",
    "rf", "async_rf", "mailoutbox", "django_assert_num_queries", "django_capture_on_commit_callbacks",
})


def tests_folder(item: pytest.Item) -> str | None:
    """The folder of tests/ that holds `item` (None: a test outside tests/)."""
    try:
        return item.path.relative_to(REPO_ROOT / "tests").parts[0]
    except ValueError:
        return None


def is_backend_independent(item: pytest.Item) -> bool:
    """Whether `item` is one of the tests the `backend_independent` marker names (see above)."""
    if tests_folder(item) not in BACKEND_INDEPENDENT_DIRS or item.get_closest_marker("django_db") is not None:
        return False
    if item.get_closest_marker("runtime") is not None:
        return False
    return not BACKEND_FIXTURES.intersection(getattr(item, "fixturenames", ()))


def pytest_sessionstart(session: pytest.Session) -> None:
    """A fast password hasher for the suite's own users, as Django's testing docs advise: production's
    PBKDF2 (1,000,000 iterations) took 0.34 s a hash here, 13 s of one pass's worker time (39 hashes in
    the control-plane, reliability and orchestration tests, counted 2026-11-28). What is
    tested of passwords (login, its limits) does not depend on the hash's cost; servers the tests
    start in their own processes keep production's hashers."""
    from django.conf import settings

    if settings.configured:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def is_browser_test(item: pytest.Item) -> bool:
    """Whether `item` drives the dashboard in Chromium (tests/browser/): the `browser` marker."""
    return tests_folder(item) == "browser"


def pytest_itemcollected(item: pytest.Item) -> None:
    # Before `-m` selects: the markers are derived from the rules, never written by hand.
    if is_backend_independent(item):
        item.add_marker(pytest.mark.backend_independent)
    if is_browser_test(item):
        item.add_marker(pytest.mark.browser)


@pytest.fixture(autouse=True)
def _example_names_do_not_resolve(monkeypatch):
    """RFC 2606's `example.com` names (alert URLs, hosts in fixtures) fail to resolve at once, as
    they do on this machine when its resolver answers quickly; without a DNS server it sometimes
    waits out its 5 s timeout instead, which cost some tests 5 s each. In this process only."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if isinstance(host, str) and (host == "example.com" or host.endswith(".example.com")):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The reference data folder beside the checkout (`../shared/data`)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"reference data not found at {SHARED_DATA}; set SPOTPIPE_SHARED_DATA")
    return SHARED_DATA
