"""A job's prepare step end to end on local nodes (issue 41): a job submitted with a text corpus and
`data.prepare`; the control plane buys its two nodes, each agent claims a share of the corpus' files
and prepares it in the job's environment (`runtime.data.prepare_share`), the share that ends last
writes the index, and the job then trains to the end on `shards:` of the prepared folder.

Marker `scenario`: CI runs it in the PostgreSQL pass with the other end-to-end runs; both sides are
also tested alone (tests/controlplane/test_prepare_step.py in both passes,
tests/orchestration/test_prepare_on_nodes.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from controlplane.jobs.models import JobEvent, JobGeneration, JobStatus, MetricSample, TrainingJob
from controlplane.orchestration import tasks
from runtime.data.prepare import prepare
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.test_end_to_end import STORY, Beat, local_nodes, stop_everything, wait_for
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture
from tests.runtime.data.test_shards import write_corpus

STEPS = 20


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_the_nodes_prepare_the_corpus_in_shares_and_the_job_trains_on_it(
    control_plane, worker, tmp_path: Path, monkeypatch  # noqa: F811
) -> None:
    provider = local_nodes(tmp_path, monkeypatch, control_plane.url)
    write_corpus(tmp_path / "corpus", count=6, size=3000)
    source, out = f"text:{tmp_path / 'corpus'}", str(tmp_path / "prepared")
    beat = Beat()
    job = None
    try:
        job = make_job(
            make_team(), strategy="recycle", target_steps=STEPS,
            config={"model": {"kind": "gpt", "n_layer": 2, "n_embd": 16, "n_head": 2, "seq_len": 8,
                              "vocab_size": 256},
                    "global_batch": 4, "seed": 1, "op_timeout_s": 2.0, "val_every": 10,
                    "data": {"source": source, "prepare": out}},
            plan={"dp": 1, "pp": 2, "microbatches": 2, "provider": "local"},
        )
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        prepared = wait_for(lambda: JobEvent.objects.filter(job=job, kind="prepared").first(), 120,
                            "the prepare step to end")
        assert prepared.data["shares"] == 2 and prepared.data["files"] == 6, prepared.data
        assert not JobGeneration.objects.filter(job=job, created_at__lt=prepared.at).exists()  # no training before
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 150, "the job to finish")
        job = retrying(TrainingJob.objects.get, pk=job.pk)
        assert job.config["data"]["source"] == f"shards:{out}" and job.steps_done >= STEPS
        claimed = {e.data["instance"] for e in JobEvent.objects.filter(job=job, kind="prepare_share_claimed")}
        first = retrying(JobGeneration.objects.get, job=job, number=1)
        assert claimed == {m["instance"] for m in first.membership}  # both nodes prepared, then both trained
        # The nodes' corpus is the one a single machine's prepare of the source makes.
        whole = prepare(source, tokenizer="byte", out=str(tmp_path / "whole"), stream=io.StringIO())
        assert json.loads((tmp_path / "prepared" / "index.json").read_text())["content_hash"] == \
            whole.index.content_hash
        assert MetricSample.objects.filter(job=job, val_loss__isnull=False).exists()  # validation read the shards
    finally:
        beat.stop.set()
        stop_everything(provider, job)
