"""Spot capacity end to end on this machine: the control plane (live server), a real Celery worker,
local node agents running the torch runtime, and the local provider's capacity script
(`SPOTPIPE_LOCAL_CAPACITY`) playing a cloud whose offerings run out.

1. The cheapest pool answers InsufficientInstanceCapacity: the job runs in the next pool, and no
   launch (the first nodes', nor a replacement's after a kill) asks the failed pool again within
   the mark's TTL.
2. Spot has no capacity at all: a `spot` job waits and its deadline becomes unreachable (an event),
   while a `spot_then_on_demand` job with the same deadline switches to on-demand and finishes in time.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.jobs.models import JobStatus, TrainingJob
from controlplane.jobs.services import job_cancel, job_submit
from controlplane.market.models import SpotPrice
from controlplane.orchestration import tasks
from controlplane.orchestration.models import UnavailableOffering
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.provider import LocalProvider
from controlplane.orchestration.services.capacity_policy import job_capacity_review
from controlplane.orchestration.services.catalogue import _instance_type_row, _zone_row
from tests.controlplane.factories import make_team
from tests.orchestration.test_end_to_end import STORY, Beat, stop_everything, wait_for
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8, "seed": 3, "op_timeout_s": 2.0,
          "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}}


def _provider(tmp_path: Path, windows: list[dict], monkeypatch, server) -> LocalProvider:
    script = tmp_path / "capacity.json"
    script.write_text(json.dumps(windows))
    provider = LocalProvider(tmp_path / "nodes", start_timeout_s=30, capacity_script=script)
    set_provider("local", provider)
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "process")
    monkeypatch.setenv("SPOTPIPE_PUBLIC_URL", server.url)
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "5.0")  # not timed here; a loaded host starts nodes slowly
    return provider


def _launches(provider: LocalProvider) -> list[dict]:
    path = provider.root / "launches.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_no_capacity_in_the_cheapest_pool_fails_over_and_is_not_asked_again(control_plane, worker, tmp_path,  # noqa: F811
                                                                          monkeypatch):
    provider = _provider(tmp_path, [{"pool": "local.node@local", "from_s": 0, "to_s": 3600,
                                     "error": "InsufficientInstanceCapacity"}], monkeypatch, control_plane)
    # Marks outlast the test however slow the host (a later launch must meet a live mark, not a
    # lapsed one that the script would fail and mark again).
    monkeypatch.setenv("SPOTPIPE_CAPACITY_UNAVAILABLE_S", "900")
    itype = _instance_type_row("local", "local.node")
    for zone, price in (("local", "0.10"), ("local-b", "0.20")):
        SpotPrice.objects.create(instance_type=itype, zone=_zone_row("local", zone), price=Decimal(price),
                                 timestamp=timezone.now())
    beat = Beat()
    job = None
    try:
        job = job_submit(team=make_team(), user=None, name="failover", strategy="recycle", target_steps=150,
                         config=CONFIG, budget_usd="5.00",
                         plan={"dp": 2, "pp": 1, "microbatches": 2, "provider": "local", "zones": ["local", "local-b"]})
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).steps_done >= 10, 90, "training in the next pool")
        # A silent kill: the replacement is launched while the cheap pool's mark holds.
        victim = Instance.objects.filter(job=job, state="running").first()
        provider.kill(victim.provider_instance_id)
        wait_for(lambda: Instance.objects.filter(job=job).count() >= 3, 60, "a replacement to be requested")
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 150, "the job to finish")

        mark = UnavailableOffering.objects.get(provider="local", instance_type="local.node", zone="local")
        assert mark.code == "InsufficientInstanceCapacity"
        launches = [entry for entry in _launches(provider) if not entry["adopted"]]
        assert launches[0]["pool"] == "local.node@local"  # the cheapest was asked first, once
        later = launches[1:]
        assert len(later) >= 2 and {entry["pool"] for entry in later} == {"local.node@local-b"}
        assert all(entry["at"] < mark.until.timestamp() for entry in later)  # all within the TTL
        zones = set(Instance.objects.filter(job=job).exclude(provider_instance_id=None)
                    .values_list("zone__code", flat=True))
        assert zones == {"local-b"}
        assert TrainingJob.objects.get(pk=job.pk).events.filter(kind="acquired",
                                                                 data__failed_pools__0__code="InsufficientInstanceCapacity"
                                                                 ).exists()
    finally:
        beat.stop.set()
        stop_everything(provider, job)


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(360)
def test_spot_then_on_demand_meets_a_deadline_that_spot_alone_misses(control_plane, worker, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    provider = _provider(tmp_path, [{"pool": "local.node@*", "from_s": 0, "to_s": 3600,
                                     "error": "InsufficientInstanceCapacity"}], monkeypatch, control_plane)
    # What one start or switch costs here, generous for a loaded 2-core host: a node process, its
    # agent and a torch worker starting.
    # The rule switches when about 2 x overhead is left (its safety net), so the on-demand node has
    # about 180 s to start and train 60 steps: ample beside two CPU-bound processes.
    monkeypatch.setenv("SPOTPIPE_CAPACITY_SWITCH_OVERHEAD_S", "90")
    beat = Beat()
    team = make_team()
    deadline = timezone.now() + timedelta(seconds=190)
    jobs: dict[str, TrainingJob] = {}
    try:
        for policy in ("spot", "spot_then_on_demand"):
            jobs[policy] = job_submit(team=team, user=None, name=policy, strategy="recycle", target_steps=60,
                                      config=CONFIG, deadline=deadline, capacity=policy,
                                      plan={"auto": True, "provider": "local", "max_nodes": 1})
            tasks.acquire_capacity.delay(jobs[policy].pk)
        STORY[:] = [jobs["spot_then_on_demand"].pk]
        beat.start()
        switching = jobs["spot_then_on_demand"]
        wait_for(lambda: TrainingJob.objects.get(pk=switching.pk).status == JobStatus.FINISHED, 190,
                 "the spot_then_on_demand job to finish")
        finished = TrainingJob.objects.get(pk=switching.pk)
        assert finished.finished_at < deadline
        assert finished.capacity_type == "on_demand"
        assert finished.events.filter(kind="capacity_switch", data__to="on_demand").exists()
        assert set(Instance.objects.filter(job=finished).values_list("lifecycle", flat=True)) == {"on_demand"}

        # The spot job has had no node all along. Beat's review would record its deadline unreachable
        # once even on-demand could not make it (about 90 s from now: the overhead before the
        # deadline); the same review, asked as of that moment, says so without the wait.
        waiting = retrying(TrainingJob.objects.get, pk=jobs["spot"].pk)
        assert waiting.steps_done == 0 and waiting.capacity_type == "spot"
        if waiting.deadline_unreachable_at is None:
            overhead = timedelta(seconds=float(os.environ["SPOTPIPE_CAPACITY_SWITCH_OVERHEAD_S"]))
            retrying(job_capacity_review, job=waiting, now=deadline - overhead + timedelta(seconds=1))
        waiting.refresh_from_db()
        assert waiting.deadline_unreachable_at is not None
        assert waiting.steps_done == 0 and waiting.status != JobStatus.FINISHED
        assert not Instance.objects.filter(job=waiting).exclude(provider_instance_id=None).exists()
        assert waiting.events.filter(kind="deadline_unreachable").count() == 1
        assert waiting.events.filter(kind="capacity_wait").exists()
        assert {entry["capacity_type"] for entry in _launches(provider) if not entry["adopted"]
                and entry["pool"] == "local.node@*"} <= {"spot", "on_demand"}
        retrying(job_cancel, job=waiting, user=None)
    finally:
        beat.stop.set()
        if "spot" in jobs:  # its first launch met the script and started its store; its release may still be queued
            from controlplane.orchestration.rendezvous import rendezvous_release

            retrying(rendezvous_release, job=jobs["spot"])
        stop_everything(provider, jobs.get("spot_then_on_demand"))
