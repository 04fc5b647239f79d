"""Experiment trackers of control-plane jobs (`tracking = ["mlflow", "wandb"]`): the control plane
forwards each job's metrics to a run of its own in MLflow or Weights & Biases, from its own process
(beat's `jobs.forward_tracking`), with the credentials of its own environment: `MLFLOW_TRACKING_URI`
(and MLflow's other variables), `WANDB_API_KEY` or `WANDB_MODE=offline` (and `WANDB_PROJECT`). No
credential passes through a job's contract, the API or the nodes, and the only addresses reached are
the ones the operator configured.

A run gets the job's contract and plan when it opens; then, step by step, the mean over the nodes'
reports of the step's loss, validation loss and samples/s (tokens/s on token windows) and the
generation it ran in (a recovery shows as a step in it); when the job ends, the weights' location,
the status and the recoveries (count and seconds lost) as tags or summary, and the run is closed.
The runs are opened and resumed by id (`spotpipe.trackers.open_tracker`), the same classes
`spotpipe train --track` logs through."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Avg, Max, Q, Sum, Value
from django.db.models.functions import Least
from django.utils import timezone

from controlplane.jobs.models import ENDED_JOB_STATUSES, JobTracker, MetricSample, Reconfiguration, TrainingJob
from runtime.config import JobConfig

logger = logging.getLogger(__name__)

TRACKERS = ("mlflow", "wandb")
"""What a control-plane job's `tracking` may name (TensorBoard's files are `spotpipe train`'s)."""
STEPS_PER_ROUND = 5000
"""Steps sent to one run per forwarding round, so one round of a long backlog stays short."""
CLAIM_S = 300
"""How long a round holds a run (its steps are sent once): longer than a round takes."""


def tracking_problems(value: Any) -> list[str]:
    """Why `value` cannot be a job's `tracking` here (empty when it can): a list of distinct tracker
    names, each known and configured in this control plane's environment."""
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        return [f"must be a list of tracker names (some of {list(TRACKERS)}), got {str(value)[:60]!r}"]
    problems = []
    for name in dict.fromkeys(value):
        if value.count(name) > 1:
            problems.append(f"names {name!r} {value.count(name)} times; expected each tracker once")
        elif name == "tensorboard":
            problems.append("'tensorboard' writes files where `spotpipe train` runs; a control-plane job's metrics "
                            "are on its page and in GET /api/v1/jobs/{id}/metrics/, or tracked with mlflow or wandb")
        elif name not in TRACKERS:
            problems.append(f"{name[:40]!r} is unknown; expected some of {list(TRACKERS)}")
        elif importlib.util.find_spec(name) is None:
            problems.append(f"{name!r}: this control plane does not have the {name} package; its operator installs "
                            f"it (pip install 'spotpipe[{name}]')")
        elif name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
            problems.append("'mlflow': this control plane has no MLFLOW_TRACKING_URI; its operator sets it in the "
                            "control plane's environment")
        elif name == "wandb" and not (os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") == "offline"):
            problems.append("'wandb': this control plane has no WANDB_API_KEY (nor WANDB_MODE=offline); its operator "
                            "sets it in the control plane's environment")
    return problems


def job_trackers_create(*, job: TrainingJob, names: Iterable[str]) -> None:
    """The job's trackers, to be opened by the first forwarding round (call inside the job's transaction)."""
    JobTracker.objects.bulk_create([JobTracker(job=job, name=name) for name in names])


def job_trackers_reopen(*, job: TrainingJob) -> None:
    """A resumed job goes on logging to the same runs, from the step it resumes at (`job.steps_done`)."""
    JobTracker.objects.filter(job=job).update(ended=False, last_step=Least("last_step", Value(job.steps_done)))


def forward_open_trackers() -> int:
    """One forwarding round over every job whose runs are not closed; returns the runs it served."""
    served = 0
    for pk in JobTracker.objects.filter(ended=False).order_by("pk").values_list("pk", flat=True):
        now = timezone.now()
        claimed = JobTracker.objects.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now), pk=pk,
                                            ended=False).update(claimed_until=now + timedelta(seconds=CLAIM_S))
        if not claimed:
            continue  # another round has it
        tracker = JobTracker.objects.get(pk=pk)
        try:
            forward_tracker(tracker)
        finally:
            JobTracker.objects.filter(pk=pk).update(claimed_until=None)
        served += 1
    return served


def forward_tracker(tracker: JobTracker) -> None:
    """Send the steps `tracker`'s run has not had yet and, once the job ended and every step was
    sent, its outcome, then close the run. A tracker that cannot be reached keeps its cursor and
    the reason (`error`); the next round tries again."""
    from spotpipe.trackers import open_tracker

    job = TrainingJob.objects.get(pk=tracker.job_id)
    ended = job.status in ENDED_JOB_STATUSES
    last = job.steps_done if ended else job.steps_done - 1  # the newest step may still get nodes' reports
    steps = _steps(job, after=tracker.last_step, upto=last)
    _files_of(job).mkdir(parents=True, exist_ok=True)
    try:
        run = open_tracker(tracker.name, out_dir=_files_of(job), config=_run_config(job),
                           run_name=tracker.run_name or f"{job.name}-{job.pk}", run_id=tracker.run_id or None)
        tracker.run_id, tracker.run_name = run.run_id, tracker.run_name or f"{job.name}-{job.pk}"
        tracker.where = getattr(run, "uri", "") or str(_files_of(job))
        for step, metrics in steps:
            run.log(step, metrics)
            tracker.last_step = step
        if ended and (not steps or steps[-1][0] >= last):
            run.finish(_outcome(job))
            tracker.ended = True
        else:
            run.suspend()
        tracker.error = ""
    except Exception as exc:  # the tracker's server, its package: whatever it raises, the job is unharmed
        tracker.error = _masked(f"{type(exc).__name__}: {exc}")
        logger.warning("job %s: tracker %s not reached: %s", job.pk, tracker.name, tracker.error)
    tracker.save(update_fields=["run_id", "run_name", "where", "last_step", "ended", "error"])


def _steps(job: TrainingJob, *, after: int, upto: int) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of the steps in (after, upto], at most `STEPS_PER_ROUND`: the mean over the
    nodes' reports of each value, and the generation the step ran in. The database averages them
    (one row a step, whatever the nodes: a 1,024-node job reports each step 1,024 times)."""
    rows = (MetricSample.objects.filter(job=job, step__gt=after, step__lte=upto)
            .values("step").order_by("step")
            .annotate(loss=Avg("loss"), val_loss=Avg("val_loss"), samples_per_s=Avg("samples_per_s"),
                      generation=Max("generation"))[:STEPS_PER_ROUND])
    tokens = JobConfig.from_dict(job.config).tokens_per_sample if job.config else None
    out = []
    for row in rows:
        metrics = {key: float(value) for key, value in row.items() if key != "step" and value is not None}
        if tokens and "samples_per_s" in metrics:
            metrics["tokens_per_s"] = metrics["samples_per_s"] * tokens
        out.append((row["step"], metrics))
    return out


def _run_config(job: TrainingJob) -> dict[str, Any]:
    config = job.config or {}
    return {"job": {"id": job.pk, "name": job.name, "strategy": job.strategy, "target_steps": job.target_steps,
                    "dp": config.get("dp"), "pp": config.get("pp"), "nodes": (job.plan or {}).get("nodes")},
            "config": job.config}


def _outcome(job: TrainingJob) -> dict[str, str]:
    """What a closed run records: the weights' location, how the job ended, its recoveries."""
    from controlplane.jobs.artifacts import job_artifacts_location

    recoveries = Reconfiguration.objects.filter(job=job, applied_at__isnull=False)
    lost = recoveries.aggregate(total=Sum("lost_seconds"))["total"] or 0.0
    return {"weights": job_artifacts_location(job=job), "status": job.status, "end_reason": job.end_reason,
            "steps_done": str(job.steps_done), "recoveries": str(recoveries.count()), "recovery_lost_s": f"{lost:.1f}"}


def _files_of(job: TrainingJob) -> Path:
    """Where a tracker keeps local files for the job (W&B's run folder)."""
    return Path(settings.VAR_DIR) / "tracking" / f"job-{job.pk}"


def _masked(text: str) -> str:
    """An error fit to store and log: credentials in a URL's user part masked, at most 500 characters."""
    return re.sub(r"(//)[^/@\s]+@", r"\1***@", text)[:500]
