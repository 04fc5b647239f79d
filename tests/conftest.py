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
