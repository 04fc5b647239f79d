"""Shared fixtures for the whole suite."""

from __future__ import annotations

import importlib.util
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
    start in their own processes keep production's hashers. And an empty static root (below).
    A GPU host runs the `gpu` tests with torch alone (tests/gpu_host/run_checks.sh): no Django there."""
    if importlib.util.find_spec("django") is None:
        return
    from django.conf import settings

    if settings.configured:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
        # The suite collects no static files (the pages' scripts come from the apps' folders), and
        # WhiteNoise warns at every handler's start when STATIC_ROOT is missing: 1,290 warnings a pass.
        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)


def is_browser_test(item: pytest.Item) -> bool:
    """Whether `item` drives the dashboard in Chromium (tests/browser/): the `browser` marker."""
    return tests_folder(item) == "browser"


# Test modules whose collection alone takes seconds, and the markers every one of their tests
# carries: schemathesis builds the fuzz's cases per API operation from the schema while collecting
# (8 s of each process's 22 s of collection here). A run whose `-m` deselects those markers does
# not import the module at all: make test's xdist workers and CI's embedded pass.
COSTLY_TO_COLLECT: dict[str, frozenset[str]] = {
    "reliability/test_api_fuzz.py": frozenset({"serial"}),
}


def _selects(markexpr: str, marks: frozenset[str] | None) -> bool:
    """Whether `-m markexpr` selects a test carrying `marks` (None: every marker name), by pytest's
    own evaluation."""
    from _pytest.mark.expression import Expression

    return Expression.compile(markexpr).evaluate(lambda name, /, **kwargs: marks is None or name in marks)


def leaves_out(markexpr: str, marks: frozenset[str]) -> bool:
    """Whether a module whose tests all carry `marks` can go uncollected under `-m markexpr`:
    deselected with those markers alone and with every other name true too (its tests carry more,
    `parametrize`, `timeout`: `-m "parametrize and serial"` keeps it). Exact while its other
    markers are ones a selection does not mix with a negation (`-m "parametrize and not timeout"`)."""
    return bool(markexpr) and not _selects(markexpr, marks) and not _selects(markexpr, None)


def _costly_marks(path: Path) -> frozenset[str] | None:
    try:
        return COSTLY_TO_COLLECT.get(path.relative_to(REPO_ROOT / "tests").as_posix())
    except ValueError:
        return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    marks = _costly_marks(collection_path)
    return True if marks is not None and leaves_out(config.option.markexpr, marks) else None


def pytest_itemcollected(item: pytest.Item) -> None:
    # Before `-m` selects: the markers are derived from the rules, never written by hand.
    if is_backend_independent(item):
        item.add_marker(pytest.mark.backend_independent)
    if is_browser_test(item):
        item.add_marker(pytest.mark.browser)
    declared = _costly_marks(item.path)
    if declared is not None and not declared <= {mark.name for mark in item.iter_markers()}:
        # Leaving the module out is right only while every one of its tests carries these markers.
        raise pytest.UsageError(f"{item.nodeid} lacks the markers tests/conftest.py's COSTLY_TO_COLLECT "
                                f"declares for its module ({', '.join(sorted(declared))})")


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


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """`spotpipe submit` against no control plane: the bodies it would send, in order (the answer is
    a queued job with an empty plan)."""
    from spotpipe import commands

    sent: list[dict] = []

    class Client:
        def submit(self, body: dict) -> dict:
            sent.append(body)
            return {"id": len(sent), "name": body.get("name", "x"), "status": "queued", "plan": {}}

    monkeypatch.setattr(commands, "_client", Client)
    monkeypatch.setattr(commands, "describe_plan", lambda plan: "")
    return sent
