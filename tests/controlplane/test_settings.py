"""Settings come from the environment and fail closed: production is the default, refuses to start
without its secrets or with DEBUG, and development mode must be asked for (SPOTPIPE_DEV=1)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    # Nothing of the test run's own mode: its settings module and SPOTPIPE_DEV, DEBUG, secrets.
    asked = {"SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ENV", "SPOTPIPE_DEV", "DEBUG", "DJANGO_SETTINGS_MODULE"}
    clean = {k: v for k, v in os.environ.items() if k not in asked}
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


PROD = {"SECRET_KEY": "a-long-random-production-secret-" + "q7Zp" * 12, "ALLOWED_HOSTS": "spotpipe.example.com"}


def _setting(name: str, **env: str) -> subprocess.CompletedProcess:
    return _manage("shell", "-c", f"from django.conf import settings; print(repr(settings.{name}))", **env)


def test_no_environment_at_all_is_production_and_refuses_to_start():
    result = _manage("check")
    assert result.returncode != 0
    assert "SECRET_KEY must be set in production" in result.stderr and "SPOTPIPE_DEV=1" in result.stderr


def test_the_wsgi_application_refuses_too():
    result = subprocess.run([sys.executable, "-c", "import controlplane.wsgi"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60,
                            env={k: v for k, v in os.environ.items()
                                 if k not in {"SECRET_KEY", "DJANGO_ENV", "SPOTPIPE_DEV", "DJANGO_SETTINGS_MODULE"}})
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_debug_is_refused_in_production():
    result = _manage("check", DEBUG="true", **PROD)
    assert result.returncode != 0 and "DEBUG must be off in production" in result.stderr


def test_a_published_development_key_is_refused_in_production():
    for key in ("dev-insecure-spotpipe-key-change-me-" + "x" * 20, "django-insecure-" + "k" * 50):
        result = _manage("check", SECRET_KEY=key, ALLOWED_HOSTS="spotpipe.example.com")
        assert result.returncode != 0 and "published development key" in result.stderr


def test_production_with_its_settings_starts_with_debug_off():
    result = _setting("DEBUG", **PROD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_development_mode_must_be_asked_for():
    result = _setting("DEBUG", SPOTPIPE_DEV="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "True"
    # The development settings module asks for it by itself (the test suite's settings).
    result = _setting("DEBUG", DJANGO_SETTINGS_MODULE="controlplane.settings_dev")
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "True"


def test_production_wins_over_a_stray_development_flag():
    result = _manage("check", DJANGO_ENV="production", SPOTPIPE_DEV="1")
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_the_demo_asks_for_development_mode_itself():
    """`spotpipe demo` (and so `make demo`) runs on a fresh machine with no environment: the CLI
    asks for development mode before Django loads its settings (not with --external)."""
    # The demo itself is replaced by a probe that reports the settings it would run with.
    script = textwrap.dedent("""
        import sys, types
        probe = types.ModuleType("spotpipe.demo.run")
        probe.DemoOptions = lambda **options: options
        def run_demo(options):
            from django.conf import settings
            print("DEBUG", settings.DEBUG)
            return 0
        probe.run_demo = run_demo
        sys.modules["spotpipe.demo.run"] = probe
        from spotpipe import cli
        sys.exit(cli.main(["demo"]))
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in {"SECRET_KEY", "DJANGO_ENV", "SPOTPIPE_DEV", "DEBUG", "DJANGO_SETTINGS_MODULE"}}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "DEBUG True" in result.stdout
