"""Every benchmark runs on a fresh set-up: what `python -m bench NAME --quick` needs (a server, a
worker, a load generator, database binaries) is installed by `make test`'s set-up or the machine,
checked by each benchmark's own `requirements()` before it starts; and a benchmark that lacks a tool
says which and how to install it instead of failing half-way with a FileNotFoundError."""

from __future__ import annotations

import importlib

import pytest

from bench.__main__ import available, default_options, main

BENCHES = available()


def test_every_benchmark_is_found() -> None:
    assert {"webhooks", "chaos", "data", "runtime", "scale"} <= set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_every_benchmark_has_what_its_quick_run_needs(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.run)
    if hasattr(module, "requirements"):
        assert module.requirements(quick=True, **default_options(module)) == []


def test_a_missing_tool_is_named_before_the_benchmark_starts(monkeypatch, capsys) -> None:
    webhooks = importlib.import_module("bench.webhooks")
    monkeypatch.setattr(webhooks, "BIN", webhooks.BIN / "nowhere")
    monkeypatch.setattr(webhooks, "run", lambda **_: pytest.fail("the benchmark started without its tools"))
    assert main(["webhooks", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "gunicorn (for the _gunicorn variants)" in err and "pip install -e '.[dev]'" in err


@pytest.mark.django_db
def test_the_webhooks_bench_seeds_its_fleet_with_the_models_of_today() -> None:
    """The webhook bench writes its fleet as rows, not through the services: a field it names that
    the models no longer have fails here, not at the start of a measurement (a submission-only
    argument written into the job rows once broke `python -m bench webhooks` unnoticed)."""
    from bench.webhooks import _seed
    from controlplane.fleet.models import Instance
    from controlplane.jobs.models import TrainingJob

    ids = _seed(9)
    assert len(set(ids)) == 9
    assert Instance.objects.filter(provider_instance_id__in=ids, state="running").count() == 9
    assert TrainingJob.objects.filter(instances__provider_instance_id__in=ids).distinct().count() == 2
