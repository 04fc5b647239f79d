"""`plan: auto` for a model function sent without its measures, end to end on local nodes (issue 40,
item 7): the job is submitted as a raw API client would (no `spotpipe submit` to measure the model);
the control plane buys one node, whose agent profiles the model in the job's environment on its
data (`runtime.train.node_profile`); the planner plans the job from that profile, and the job
trains to the end on the planned nodes, the profiled node among them.

Marker `scenario`: CI runs it once, in the embedded pass with the other end-to-end runs; both sides
are also tested alone (tests/controlplane/test_profile_first.py in both passes,
tests/orchestration/test_node_profile.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.jobs.models import JobEvent, JobGeneration, JobStatus, TrainingJob
from controlplane.jobs.services import job_submit
from controlplane.orchestration import tasks
from runtime.config import JobConfig
from tests.controlplane.api_helpers import make_api_user
from tests.controlplane.factories import make_team
from tests.orchestration.test_end_to_end import STORY, Beat, local_nodes, stop_everything, wait_for
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

M = "tests.usermodels.models"
STEPS = 30


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_the_first_node_profiles_the_model_and_the_job_trains_on_the_plan_made_from_it(
    control_plane, worker, tmp_path: Path, monkeypatch  # noqa: F811
) -> None:
    provider = local_nodes(tmp_path, monkeypatch, control_plane.url)
    team = make_team()
    beat = Beat()
    job = None
    try:
        job = job_submit(
            team=team, user=make_api_user(team), name="profiled-first", strategy="recycle", target_steps=STEPS,
            config={"model": {"kind": "py", "path": f"{M}:resmlp", "loss": f"{M}:huber",
                              "args": {"width": 16, "blocks": 2}},
                    "data": {"source": f"py:{M}:regression"}, "global_batch": 8, "seed": 5, "lr": 0.01,
                    "op_timeout_s": 2.0,
                    "device_time": {"forward_ms": 2, "backward_input_ms": 2, "backward_weight_ms": 2}},
            plan={"auto": True, "provider": "local", "max_nodes": 2}, deadline=timezone.now() + timedelta(hours=1),
        )
        assert job.plan["profile"] == "pending" and job.plan["nodes"] == 1
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        planned = wait_for(lambda: JobEvent.objects.filter(job=job, kind="planned").first(), 90,
                           "the plan from the first node's profile")
        job = retrying(TrainingJob.objects.get, pk=job.pk)
        assert job.plan["profile"] == "" and job.plan["chosen_by"] == "planner", job.plan
        profiled = retrying(Instance.objects.get, pk=planned.data["instance"])
        stored = JobConfig.from_dict(job.config)
        assert stored.model.layers == 4 and len(stored.model.layer_measures) == 4
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 150, "the job to finish")
        job = retrying(TrainingJob.objects.get, pk=job.pk)
        assert job.steps_done >= STEPS
        first = retrying(JobGeneration.objects.get, job=job, number=1)
        assert len(first.membership) == job.config["dp"] * job.config["pp"]
        assert profiled.pk in {m["instance"] for m in first.membership}  # the profiled node trained too
    finally:
        beat.stop.set()
        stop_everything(provider, job)
