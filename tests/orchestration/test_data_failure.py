"""Data that only a node can find wrong fails the job once (issue 18). End to end on this machine:
the control plane (live server), a real Celery worker, two local node agents running the torch
runtime (DP=1 x PP=2) on a job whose data source names a token file that does not exist on the
nodes. The control plane cannot see the nodes' disks, so it accepts the job; each node's runtime
raises `JobCannotContinue("data: ...")`, the agent reports exit code EXIT_JOB_FAILED with that
message and does not start the worker again, and the control plane fails the job once, with the
runtime's message on its timeline, and releases the nodes.

Marker `scenario`: CI runs it in the PostgreSQL pass only, with the other end-to-end runs (what
the database adds here, the job's failure and release, is the same service on either backend)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controlplane.fleet.models import Instance
from controlplane.jobs.models import JobEvent, JobStatus, MetricSample, TrainingJob
from controlplane.orchestration import tasks
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.provider import LocalProvider
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.test_end_to_end import STORY, Beat, stop_everything, wait_for
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

MISSING = "/nonexistent/spotpipe-h18/train.bin"


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_a_token_file_missing_on_the_nodes_fails_the_job_once_without_restarts(
    control_plane, worker, tmp_path: Path, monkeypatch  # noqa: F811
) -> None:
    nodes_dir = tmp_path / "nodes"
    provider = LocalProvider(nodes_dir, start_timeout_s=30)
    set_provider("local", provider)
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "process")
    monkeypatch.setenv("SPOTPIPE_PUBLIC_URL", control_plane.url)
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "5.0")
    beat = Beat()
    job = None
    try:
        job = make_job(
            make_team(), strategy="recycle", target_steps=40,
            config={"model": {"kind": "gpt", "n_layer": 2, "n_embd": 16, "n_head": 2, "seq_len": 8,
                              "vocab_size": 256},
                    "global_batch": 4, "seed": 1, "op_timeout_s": 2.0, "val_every": 10,
                    "data": {"source": f"tokens:{MISSING}"}},
            plan={"dp": 1, "pp": 2, "microbatches": 2, "provider": "local"},
        )
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FAILED, 120, "the job to fail")
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=["running", "pending", "notice"]).exists(),
                 30, "every node released")
        time.sleep(2.0)  # a worker started again would have reported a second exit by now

        job = retrying(TrainingJob.objects.get, pk=job.pk)
        assert job.status_message.startswith("runtime cannot continue: data: "), job.status_message
        assert MISSING in job.status_message and "does not exist" in job.status_message
        failed = list(JobEvent.objects.filter(job=job, kind="job_failed"))
        assert len(failed) == 1 and MISSING in failed[0].message  # failed once, with the runtime's message
        exits = list(JobEvent.objects.filter(job=job, kind="agent_worker_exit"))
        assert exits, "no agent reported its worker's exit"
        for event in exits:
            assert event.data["code"] == 4 and MISSING in event.data["reason"], event.data
        per_instance = [e.data.get("instance") for e in exits]
        assert len(per_instance) == len(set(per_instance)), f"a worker exited more than once: {per_instance}"
        # No agent started its worker a second time (a restart loop would, for an ordinary crash).
        starts = {path.parent.name: path.read_text(errors="replace").count("started worker pid")
                  for path in nodes_dir.glob("*/node.log")}
        assert starts and max(starts.values()) == 1, starts
        assert not MetricSample.objects.filter(job=job).exists() and job.steps_done == 0
    finally:
        beat.stop.set()
        stop_everything(provider, job)
