"""Settings come from the environment; production refuses to start without its secrets."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ENV"}}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env={**clean, **env},
        capture_output=True, text=True, timeout=60,
    )


def test_production_without_secret_key_fails_fast_naming_it():
    result = _manage("check", DJANGO_ENV="production", ALLOWED_HOSTS="example.com")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_production_without_allowed_hosts_fails_fast():
    result = _manage("check", DJANGO_ENV="production", SECRET_KEY="k" * 60)
    assert result.returncode != 0
    assert "ALLOWED_HOSTS must be set" in result.stderr


def test_production_passes_check_deploy():
    result = _manage(
        "check", "--deploy", "--fail-level", "WARNING",
        DJANGO_ENV="production", SECRET_KEY="a-long-random-production-secret-" + "q7Zp" * 12,
        ALLOWED_HOSTS="spotpipe.example.com",
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout
