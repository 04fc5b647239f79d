"""Money a team can trust (issue 39): budget stops, the queue, the standby safety net.

    python -m bench money [--quick] [--json PATH]

A real control plane in this process (bench/reconfigure.py's cluster: WSGI server threads, a Celery
worker thread, the production periodic tasks at their periods, SQLite in a temporary directory) and
the local provider's nodes (agents + torch runtime), priced as spot nodes at $36/h each so that
budgets meet real spend.

1. Budget stop (`trials`: 1 quick, 3 full). A dp=2 x pp=2 recycle job trains; after 20 steps its
   budget is set to what it has spent plus $0.05, which the next reconcile finds within the 60 s
   stop margin. Measured: seconds from the budget change to `stopped`, whether the stop's checkpoint
   completed, and the overshoot: the spend past the budget once every node is released, in seconds
   of the fleet's spend (goal <= 60). Baseline, from the same run: what alerts alone (the behaviour
   before) would have spent past the cap, the job's remaining steps at its measured step time. Then
   the job is resumed with a larger budget and finishes; `resume_params_equal` is whether every
   parameter equals the uninterrupted run's of the same seed (goal true).
2. Queue. A team with `max_jobs=1` submits two jobs; the second waits `queued` and is admitted
   when the first ends. Measured: seconds from the first job's end to the second's admission (goal:
   one reconcile interval, 3 s), and to its first generation.
3. Standby. A running node its job's generation does not take, beyond the plan's spares, is
   released by the reconcile: measured on the services with the reconcile's period (3 s ticks on a
   given clock) against `SPOTPIPE_STANDBY_LIMIT_S`: the longest a node stood by paid (goal <= the
   limit plus one tick).
"""

from __future__ import annotations

import logging
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.reconfigure import _Cluster, _wait
from bench.report import Progress, print_table

PRICE_PER_NODE_HOUR = Decimal("36")
RECONCILE_S = 3.0
CONFIG = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8, "op_timeout_s": 2.0,
          "checkpoint_interval": 50, "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}}
LIVE = ("requested", "pending", "running", "notice")


def _price_local_nodes() -> None:
    from django.utils import timezone

    from controlplane.market.models import SpotPool, SpotPrice
    from controlplane.orchestration.services.catalogue import _instance_type_row, _zone_row

    local_type, local_zone = _instance_type_row("local", "local.node"), _zone_row("local", "local")
    at = timezone.now() - timedelta(hours=1)
    SpotPrice.objects.create(instance_type=local_type, zone=local_zone, product="Linux/UNIX",
                             price=PRICE_PER_NODE_HOUR, timestamp=at)
    SpotPool.objects.update_or_create(instance_type=local_type, zone=local_zone, product="Linux/UNIX",
                                      defaults={"latest_timestamp": at, "latest_price": PRICE_PER_NODE_HOUR})


def _params_equal(job: Any, nodes_dir: Path, node_ids: list[str]) -> bool:
    import torch

    from runtime.config import JobConfig
    from runtime.train.reference import train_reference

    config = JobConfig.from_dict(job.config)
    reference, _ = train_reference(JobConfig.from_dict({**config.to_dict(), "init_from": ""}))
    copies: dict[str, list[torch.Tensor]] = {}
    for node_id in node_ids:
        for path in sorted((nodes_dir / node_id).glob("work/out/node-*.pt")):
            for name, tensor in torch.load(path)["params"].items():
                copies.setdefault(name, []).append(tensor)
    return set(copies) == set(reference) and all(
        torch.equal(copy, expected) for name, expected in reference.items() for copy in copies[name])


def _budget_trial(cp: _Cluster, team: Any, seed: int, progress: Progress) -> dict[str, Any]:
    from django.utils import timezone

    from controlplane.billing.metering import job_meter
    from controlplane.fleet.models import Instance
    from controlplane.jobs.artifacts import job_latest_checkpoint
    from controlplane.jobs.models import JobEvent, JobStatus, TrainingJob
    from controlplane.jobs.selectors import job_measured_step_s
    from controlplane.jobs.services import job_resume, job_submit

    steps = 400
    job = job_submit(team=team, user=None, name=f"budget-{seed}", strategy="recycle", target_steps=steps,
                     budget_usd=Decimal("1000"), config={**CONFIG, "seed": seed},
                     plan={"dp": 2, "pp": 2, "microbatches": 2, "provider": "local", "zones": ["local"]})
    _wait(lambda: TrainingJob.objects.get(pk=job.pk).steps_done >= 20, 240, "20 steps")
    meter = job_meter(job_id=job.pk, at=timezone.now())
    budget = (meter.spent_usd + Decimal("0.05")).quantize(Decimal("0.01"))
    changed = time.monotonic()
    TrainingJob.objects.filter(pk=job.pk).update(budget_usd=budget)
    _wait(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.STOPPED, 240, "the budget stop")
    stop_s = time.monotonic() - changed
    _wait(lambda: not Instance.objects.filter(job=job, state__in=LIVE).exists(), 60, "every node released")
    stopped = TrainingJob.objects.get(pk=job.pk)
    final = job_meter(job_id=job.pk, at=timezone.now())
    overshoot_s = float(max(Decimal(0), final.spent_usd - budget) / meter.usd_per_hour * 3600)
    step_s = job_measured_step_s(stopped) or 0.0
    event = JobEvent.objects.filter(job=job, kind="job_stopped").order_by("-id").first()
    first_nodes = set(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
    checkpoint = job_latest_checkpoint(job=job)
    progress.step(f"budget trial {seed}: stopped at step {stopped.steps_done}; resuming to the end")
    job_resume(job=stopped, budget_usd="1000.00")
    _wait(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 300, "the resumed job to finish")
    _wait(lambda: not Instance.objects.filter(job=job, state__in=LIVE).exists(), 60, "every node released")
    new_nodes = sorted(set(Instance.objects.filter(job=job).values_list("provider_instance_id", flat=True))
                       - first_nodes)
    return {
        "stop_s": round(stop_s, 2), "overshoot_s_of_spend": round(overshoot_s, 2),
        "alerts_only_overshoot_s": round((steps - stopped.steps_done) * step_s, 1),
        "checkpoint_written": bool(event and event.data.get("checkpoint_written")),
        "checkpoint_step": checkpoint, "steps_at_stop": stopped.steps_done,
        "resume_params_equal": _params_equal(TrainingJob.objects.get(pk=job.pk), cp.provider.root, new_nodes),
    }


def _queue(team: Any) -> dict[str, Any]:
    from controlplane.accounts.models import TeamQuota
    from controlplane.jobs.models import JobEvent, JobGeneration, JobStatus, TrainingJob
    from controlplane.jobs.services import job_submit

    TeamQuota.objects.update_or_create(team=team, defaults={"max_jobs": 1})
    plan = {"dp": 1, "pp": 2, "microbatches": 2, "provider": "local", "zones": ["local"]}
    first, second = (job_submit(team=team, user=None, name=f"queue-{n}", strategy="recycle", target_steps=40,
                                budget_usd=Decimal("100"), config={**CONFIG, "seed": 11 + n}, plan=plan)
                     for n in (1, 2))
    queued = second.status == JobStatus.QUEUED
    _wait(lambda: TrainingJob.objects.get(pk=first.pk).status == JobStatus.FINISHED, 300, "the first job")
    _wait(lambda: JobEvent.objects.filter(job=second, kind="admitted").exists(), 60, "the second admitted")
    _wait(lambda: JobGeneration.objects.filter(job=second).exists(), 120, "the second's first generation")
    ended = TrainingJob.objects.get(pk=first.pk).finished_at
    admitted = JobEvent.objects.get(job=second, kind="admitted").at
    generation = JobGeneration.objects.filter(job=second).order_by("number").first().created_at
    _wait(lambda: TrainingJob.objects.get(pk=second.pk).status == JobStatus.FINISHED, 300, "the second job")
    TeamQuota.objects.filter(team=team).delete()
    return {"second_was_queued": queued, "start_after_free_s": round((admitted - ended).total_seconds(), 2),
            "first_generation_after_free_s": round((generation - ended).total_seconds(), 2)}


class _NoCloud:
    """A provider whose nodes exist only as rows (the standby section's): terminate is recorded."""

    kind = "local"

    def __init__(self) -> None:
        self.terminated: list[str] = []

    def terminate(self, ids: Any) -> None:
        self.terminated += list(ids)

    def describe(self, ids: Any) -> list:
        return []


def _standby(team: Any) -> dict[str, Any]:
    from django.utils import timezone

    from controlplane.fleet.models import Instance
    from controlplane.jobs.models import JobGeneration, TrainingJob
    from controlplane.jobs.services import job_submit
    from controlplane.orchestration.providers import get_provider, set_provider
    from controlplane.orchestration.services.standby import standby_limit_s, standby_review

    job = job_submit(team=team, user=None, name="standby", strategy="recycle", target_steps=10,
                     budget_usd=Decimal("100"), config={**CONFIG, "seed": 3},
                     plan={"dp": 1, "pp": 2, "nodes": 3, "microbatches": 2, "provider": "local"})
    TrainingJob.objects.filter(pk=job.pk).update(status="running", current_generation=1)
    job.refresh_from_db()
    itype = Instance._meta.get_field("instance_type").related_model.objects.first()
    nodes = [Instance.objects.create(team=team, job=job, state="running", provider="local", instance_type=itype,
                                     provider_instance_id=f"standby-{n}") for n in range(4)]
    JobGeneration.objects.create(job=job, number=1, created_at=timezone.now(), layout={}, membership=[
        {"instance": nodes[0].pk, "rank": 0}, {"instance": nodes[1].pk, "rank": 1}])
    previous = get_provider("local")
    cloud = _NoCloud()
    set_provider("local", cloud)
    try:
        t0 = timezone.now()
        released_at: dict[int, float] = {}
        tick = 0
        limit = standby_limit_s()
        while len(released_at) < 1 and tick * RECONCILE_S < limit * 3:
            for pk in standby_review(job=job, now=t0 + timedelta(seconds=tick * RECONCILE_S)):
                released_at[pk] = tick * RECONCILE_S
            tick += 1
    finally:
        set_provider("local", previous)
    kept = [i for i in Instance.objects.filter(pk__in=[n.pk for n in nodes[2:]]) if i.state == "running"]
    return {"limit_s": limit, "longest_paid_s": max(released_at.values()) if released_at else None,
            "released": len(released_at), "spares_kept": len(kept), "reconcile_s": RECONCILE_S}


def run(*, quick: bool = False, progress: Progress) -> dict[str, Any]:
    for name in ("celery", "django.request", "django.server"):
        logging.getLogger(name).setLevel(logging.ERROR)
    trials = 1 if quick else 3
    tmp = tempfile.mkdtemp(prefix="spotpipe-bench-money-")
    with _Cluster(Path(tmp), progress) as cp:
        import os

        from controlplane.accounts.models import Team

        os.environ["SPOTPIPE_STOP_CHECKPOINT_WAIT_S"] = "150"  # a loaded machine writes slowly: wait for it
        _price_local_nodes()
        team = Team.objects.create(name="Bench money", slug="bench-money")
        budget = []
        for trial in range(trials):
            progress.step(f"budget trial {trial + 1}/{trials}", trial + 1, trials)
            budget.append(_budget_trial(cp, team, 21 + trial, progress))
        progress.step("queue: a second job over max_jobs=1")
        queue = _queue(team)
        progress.step("standby: a node no generation takes")
        standby = _standby(team)

    worst = max(t["overshoot_s_of_spend"] for t in budget)
    alerts = min(t["alerts_only_overshoot_s"] for t in budget)
    figures = {
        "budget": {"trials": budget, "overshoot_s_of_spend": worst, "alerts_only_overshoot_s": alerts,
                   "overshoot_ratio_to_alerts_only": round(worst / alerts, 4) if alerts else None,
                   "resume_params_equal": all(t["resume_params_equal"] for t in budget),
                   "checkpoint_written": all(t["checkpoint_written"] for t in budget),
                   "goal_overshoot_s": 60, "price_per_node_hour_usd": str(PRICE_PER_NODE_HOUR)},
        "queue": {**queue, "goal_s": RECONCILE_S},
        "standby": {**standby, "goal_s": standby["limit_s"] + RECONCILE_S},
    }
    print_table(
        f"money: {trials} budget trial(s) of 4 local nodes at ${PRICE_PER_NODE_HOUR}/h each, a queue, a standby node",
        ["figure", "value", "baseline (same run)", "goal"],
        [["budget overshoot, s of fleet spend (worst)", worst, f"{alerts} (alerts only)", "<= 60"],
         ["stop: budget change -> stopped, s (worst)", max(t["stop_s"] for t in budget), "", ""],
         ["stop checkpoint complete", figures["budget"]["checkpoint_written"], "", "true"],
         ["resumed weights equal uninterrupted", figures["budget"]["resume_params_equal"], "", "true"],
         ["queue: first ends -> second admitted, s", queue["start_after_free_s"], "", f"<= {RECONCILE_S}"],
         ["queue: first ends -> second's generation, s", queue["first_generation_after_free_s"], "", ""],
         ["standby: longest paid, s", standby["longest_paid_s"], f"limit {standby['limit_s']}",
          f"<= {standby['limit_s'] + RECONCILE_S}"]],
    )
    ok = (figures["budget"]["resume_params_equal"] and figures["budget"]["checkpoint_written"]
          and queue["second_was_queued"] and standby["released"] == 1 and standby["spares_kept"] == 1)
    figures["ok"] = bool(ok)
    return figures
