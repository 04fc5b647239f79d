"""Jobs API and services: submission with field-named validation, cancel/resume with 409s,
metrics batches (all or nothing, progress), generations, events and list filters."""

from __future__ import annotations

import copy
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.jobs.models import JobEvent, JobGeneration, JobStatus, MetricSample, TrainingJob
from controlplane.jobs.services import job_generation_publish, job_record_metrics
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_job

pytestmark = pytest.mark.django_db

SPEC = {"kind": "gpt", "layers": 4, "d_model": 64, "heads": 4, "seq_len": 32, "vocab": 128,
        "global_batch": 16, "micro_batches": 4}


@pytest.fixture
def world():
    return make_team_world()


def _submission(**changes):
    body = {"name": "llm-small", "model_spec": copy.deepcopy(SPEC), "strategy": "recycle",
            "target_steps": 500, "budget_usd": "25.50"}
    for key, value in changes.items():
        if key.startswith("model_spec."):
            name = key.split(".", 1)[1]
            if value is _DROP:
                body["model_spec"].pop(name)
            else:
                body["model_spec"][name] = value
        elif value is _DROP:
            body.pop(key)
        else:
            body[key] = value
    return body


_DROP = object()


def test_submit_creates_a_pending_job_and_its_event(world):
    deadline = (timezone.now() + timedelta(days=1)).isoformat()
    response = world.member_client.post("/api/v1/jobs/", _submission(deadline=deadline), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    job = TrainingJob.objects.get(pk=body["id"])
    assert (job.team_id, job.created_by_id, job.status) == (world.team.pk, world.member.pk, JobStatus.PENDING)
    assert job.budget_usd == Decimal("25.50") and job.deadline is not None
    assert body["created_by"] == world.member.username and body["live_instance_count"] == 0
    assert list(JobEvent.objects.filter(job=job).values_list("kind", flat=True)) == ["submitted"]


def test_mlp_needs_no_transformer_fields(world):
    spec = {"kind": "mlp", "layers": 3, "d_model": 32, "global_batch": 8, "micro_batches": 2}
    response = world.member_client.post("/api/v1/jobs/", _submission(model_spec=spec), format="json")
    assert response.status_code == 201, response.content


PAST = "2001-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model_spec.kind": "lstm"}, "model_spec.kind"),
        ({"model_spec.heads": 5}, "model_spec.heads"),  # 64 is not divisible by 5
        ({"model_spec.heads": 0}, "model_spec.heads"),
        ({"model_spec.layers": -1}, "model_spec.layers"),
        ({"model_spec.layers": True}, "model_spec.layers"),
        ({"model_spec.d_model": "64"}, "model_spec.d_model"),
        ({"model_spec.seq_len": 0}, "model_spec.seq_len"),
        ({"model_spec.depth": 3}, "model_spec.depth"),  # not a field of the contract
        ({"model_spec.vocab": 1.5}, "model_spec.vocab"),
        ({"model_spec.micro_batches": 3}, "model_spec.micro_batches"),  # does not divide 16
        ({"model_spec.global_batch": 0}, "model_spec.global_batch"),
        ({"model_spec": [1, 2]}, "model_spec"),
        ({"strategy": "yolo"}, "strategy"),
        ({"target_steps": 0}, "target_steps"),
        ({"target_steps": "many"}, "target_steps"),
        ({"budget_usd": "0"}, "budget_usd"),
        ({"budget_usd": "-3"}, "budget_usd"),
        ({"budget_usd": "1.234"}, "budget_usd"),
        ({"budget_usd": _DROP, "deadline": PAST}, "deadline"),
        ({"deadline": "soon"}, "deadline"),
        ({"budget_usd": _DROP}, "non_field_errors"),  # neither deadline nor budget
        ({"name": ""}, "name"),
        ({"name": _DROP}, "name"),
        ({"name": 5}, "name"),
        ({"name": 2.5}, "name"),
    ],
)
def test_bad_submission_names_the_field_and_writes_nothing(world, changes, field):
    before = (TrainingJob.objects.count(), JobEvent.objects.count())
    response = world.member_client.post("/api/v1/jobs/", _submission(**changes), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["errors"], body
    assert field in body["detail"]
    assert (TrainingJob.objects.count(), JobEvent.objects.count()) == before


def test_all_spec_errors_are_reported_at_once(world):
    response = world.member_client.post(
        "/api/v1/jobs/", _submission(**{"model_spec.heads": 7, "model_spec.micro_batches": 5}), format="json"
    )
    assert set(response.json()["errors"]) == {"model_spec.heads", "model_spec.micro_batches"}


def test_cancel_then_resume_records_events_and_refuses_illegal_moves(world):
    job, client = world.job, world.member_client
    url = f"/api/v1/jobs/{job.pk}"
    response = client.post(f"{url}/resume/")
    assert response.status_code == 409
    assert "pending" in response.json()["detail"] and "status" in response.json()["errors"]

    response = client.post(f"{url}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    job.refresh_from_db()
    assert job.finished_at is not None
    response = client.post(f"{url}/cancel/")
    assert response.status_code == 409 and "'cancelled'" in response.json()["detail"]

    response = client.post(f"{url}/resume/")
    assert response.status_code == 200 and response.json()["status"] == "pending"
    job.refresh_from_db()
    assert job.finished_at is None
    kinds = list(JobEvent.objects.filter(job=job).exclude(kind="submitted").values_list("kind", flat=True))
    assert kinds == ["cancelled", "resumed"]
    events = client.get(f"{url}/events/").json()["results"]
    assert [e["kind"] for e in events] == ["submitted", "cancelled", "resumed"]
    assert [e["kind"] for e in client.get(f"{url}/events/?kind=resumed").json()["results"]] == ["resumed"]


@pytest.mark.parametrize("status", [JobStatus.FINISHED])
def test_finished_job_can_be_neither_cancelled_nor_resumed(world, status):
    TrainingJob.objects.filter(pk=world.job.pk).update(status=status)
    for verb in ("cancel", "resume"):
        response = world.member_client.post(f"/api/v1/jobs/{world.job.pk}/{verb}/")
        assert response.status_code == 409 and "'finished'" in response.json()["detail"]
    assert not JobEvent.objects.filter(job=world.job).exclude(kind="submitted").exists()


def test_metrics_batch_updates_progress(world):
    job = world.job
    now = timezone.now()
    samples = [
        {"step": 1, "loss": 5.0, "samples_per_s": 100.0, "at": (now - timedelta(seconds=2)).isoformat()},
        {"step": 2, "loss": 4.0, "stage_times": {"0": 0.1, "1": 0.2}},
        {"step": 3, "loss": 3.5, "instance": world.instance.pk},
    ]
    response = world.member_client.post(f"/api/v1/jobs/{job.pk}/metrics/", {"samples": samples}, format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {"stored": 3, "steps_done": 3, "samples_done": 48, "last_loss": 3.5,
                               "last_val_loss": None}
    job.refresh_from_db()
    assert (job.steps_done, job.samples_done, job.initial_loss, job.last_loss) == (3, 48, 5.0, 3.5)
    assert job.started_at is not None
    # An older batch arriving late is stored but does not rewind progress.
    response = world.member_client.post(f"/api/v1/jobs/{job.pk}/metrics/", [{"step": 2, "loss": 9.0}], format="json")
    assert response.status_code == 201
    job.refresh_from_db()
    assert (job.steps_done, job.last_loss, job.initial_loss) == (3, 3.5, 5.0)
    listed = world.member_client.get(f"/api/v1/jobs/{job.pk}/metrics/?since_step=2&until_step=2").json()
    assert sorted(s["loss"] for s in listed["results"]) == [4.0, 9.0]


def test_validation_loss_is_its_own_metric(world):
    """A validation pass comes as samples with val_loss and no loss, one per node (the runtime
    reports it on every node): stored beside the training samples, it moves last_val_loss and
    nothing that is about the training loss."""
    job = world.job
    url = f"/api/v1/jobs/{job.pk}/metrics/"
    train = [{"step": s, "loss": 5.0 - s / 10, "samples_per_s": 100.0} for s in range(1, 11)]
    assert world.member_client.post(url, train, format="json").status_code == 201
    # Two nodes report the pass after step 10, in a batch of their own; then step 11 trains on.
    response = world.agent_client.post(url, [{"step": 10, "val_loss": 4.4}], format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {"stored": 1, "steps_done": 10, "samples_done": 160, "last_loss": 4.0,
                               "last_val_loss": 4.4}
    world.member_client.post(url, [{"step": 10, "val_loss": 4.4}, {"step": 11, "loss": 3.9}], format="json")
    job.refresh_from_db()
    assert (job.steps_done, job.initial_loss, job.last_loss, job.last_val_loss) == (11, 4.9, 3.9, 4.4)

    # A batch of only validation samples never touches the training loss, even as the first batch.
    fresh = make_job(world.team)
    response = world.member_client.post(f"/api/v1/jobs/{fresh.pk}/metrics/", [{"step": 5, "val_loss": 2.5}],
                                        format="json")
    assert response.status_code == 201
    fresh.refresh_from_db()
    assert (fresh.initial_loss, fresh.last_loss, fresh.last_val_loss, fresh.steps_done) == (None, None, 2.5, 5)

    # A late pass of an earlier step is stored but does not rewind last_val_loss.
    world.member_client.post(url, [{"step": 20, "val_loss": 3.0}], format="json")
    world.member_client.post(url, [{"step": 15, "val_loss": 3.7}], format="json")
    job.refresh_from_db()
    assert job.last_val_loss == 3.0

    # The API: the job and its metrics (filtered by step like any sample).
    body = world.member_client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["last_val_loss"] == 3.0 and body["last_loss"] == 3.9
    listed = world.member_client.get(f"{url}?since_step=10&until_step=10").json()["results"]
    assert sorted((s["loss"], s["val_loss"]) for s in listed if s["val_loss"] is not None) == [(None, 4.4)] * 2
    assert [s["loss"] for s in listed if s["val_loss"] is None] == [4.0]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "low"])
def test_a_bad_validation_loss_stores_nothing(world, value):
    samples = [{"step": 1, "loss": 2.0}, {"step": 1, "val_loss": value}]
    response = world.member_client.post(f"/api/v1/jobs/{world.job.pk}/metrics/", samples, format="json")
    assert response.status_code == 400 and "samples[1].val_loss" in response.json()["errors"], response.content
    assert MetricSample.objects.filter(job=world.job).count() == 0


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"step": -1}, "samples[2].step"),
        ({"step": "x"}, "samples[2].step"),
        ({"loss": "NaN-ish"}, "samples[2].loss"),
        ({"samples_per_s": -5}, "samples[2].samples_per_s"),
        ({"at": "yesterday"}, "samples[2].at"),
        ({"stage_times": {"0": -1}}, "samples[2].stage_times.0"),
        ({"instance": 10**9}, "samples[2].instance"),
        ({"generation": -2}, "samples[2].generation"),
    ],
)
def test_metrics_batch_with_one_bad_sample_stores_none(world, bad, field):
    job = world.job
    samples = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.9}, {"step": 3, "loss": 1.8, **bad}]
    response = world.member_client.post(f"/api/v1/jobs/{job.pk}/metrics/", samples, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert MetricSample.objects.filter(job=job).count() == 0
    job.refresh_from_db()
    assert (job.steps_done, job.last_loss) == (0, None)


@pytest.mark.parametrize("body", [[], {"samples": []}, {"nothing": 1}, "text", [{"step": 1}] * 1001])
def test_metrics_batch_shape_errors(world, body):
    response = world.member_client.post(f"/api/v1/jobs/{world.job.pk}/metrics/", body, format="json")
    assert response.status_code == 400
    assert any(key.startswith("samples") or key == "non_field_errors" for key in response.json()["errors"])
    assert MetricSample.objects.count() == 0


def test_agent_reports_metrics_for_its_own_instance_only(world):
    url = f"/api/v1/jobs/{world.job.pk}/metrics/"
    response = world.agent_client.post(url, [{"step": 1, "loss": 1.0}], format="json")
    assert response.status_code == 201
    assert MetricSample.objects.get(job=world.job).instance_id == world.instance.pk
    from tests.controlplane.factories import make_instance

    other = make_instance(world.team, job=world.job)
    response = world.agent_client.post(url, [{"step": 2, "loss": 1.0, "instance": other.pk}], format="json")
    assert response.status_code == 400 and "samples[0].instance" in response.json()["errors"]
    assert MetricSample.objects.filter(job=world.job).count() == 1


def test_metric_service_rejects_non_finite_values(world):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as err:
        job_record_metrics(job=world.job, samples=[{"step": 1, "loss": float("nan")}])
    assert "samples[0].loss" in err.value.message_dict
    assert MetricSample.objects.count() == 0


def test_generation_publish_numbers_grow_and_replays_are_idempotent(world):
    job = world.job
    members = [{"instance": world.instance.pk, "rank": 0, "pipeline": 0, "stage": 0}]
    first = job_generation_publish(job=job, membership=members, layout={"dp": 1, "pp": 1}, reason="start")
    again = job_generation_publish(job=job, membership=members, layout={"dp": 1, "pp": 1}, reason="retry")
    assert first.pk == again.pk and first.number == 1
    second = job_generation_publish(job=job, membership=[], layout={"dp": 0, "pp": 1}, reason="preempted")
    assert second.number == 2
    job.refresh_from_db()
    assert job.current_generation == 2
    assert list(JobEvent.objects.filter(job=job, kind="generation").values_list("data__number", flat=True)) == [1, 2]
    listed = world.agent_client.get(f"/api/v1/jobs/{job.pk}/generations/").json()["results"]
    assert [g["number"] for g in listed] == [1, 2] and listed[0]["membership"] == members


@pytest.mark.parametrize(
    ("membership", "field"),
    [("x", "membership"), ([{"rank": 0}], "membership[0].instance"),
     ([{"instance": 1, "rank": 0}, {"instance": 2, "rank": 0}], "membership[1].rank")],
)
def test_generation_publish_validates_membership(world, membership, field):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as err:
        job_generation_publish(job=world.job, membership=membership, layout={})
    assert field in err.value.message_dict
    assert not JobGeneration.objects.exists()


def test_job_list_filters_search_and_ordering(world):
    make_job(world.team, name="alpha-run", strategy="bamboo", status=JobStatus.RUNNING)
    make_job(world.team, name="beta-run", strategy="oobleck", status=JobStatus.FAILED)
    client = world.member_client

    def names(query: str) -> list[str]:
        response = client.get(f"/api/v1/jobs/{query}")
        assert response.status_code == 200, response.content
        return [j["name"] for j in response.json()["results"]]

    assert names("?status=running") == ["alpha-run"]
    assert names("?strategy=oobleck") == ["beta-run"]
    assert names("?search=RUN&ordering=name") == ["alpha-run", "beta-run"]
    assert names("?search=run&ordering=-name") == ["beta-run", "alpha-run"]
    assert len(names("?page_size=1")) == 1


@pytest.mark.parametrize(
    ("query", "param"),
    [("status=bogus", "status"), ("strategy=fast", "strategy"), ("ordering=password", "ordering"),
     ("team=abc", "team")],
)
def test_bad_job_filter_answers_400_naming_the_parameter(world, query, param):
    response = world.member_client.get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400
    assert param in response.json()["errors"] and param in response.json()["detail"]


@pytest.mark.parametrize(("query", "param"), [("since_step=-1", "since_step"), ("instance=x", "instance")])
def test_bad_metric_filter_answers_400(world, query, param):
    response = world.member_client.get(f"/api/v1/jobs/{world.job.pk}/metrics/?{query}")
    assert response.status_code == 400 and param in response.json()["errors"]


def test_a_metrics_batch_sent_again_is_stored_once(world):
    """An agent whose POST timed out after the commit sends the batch again (issue 21: metrics
    idempotence): one row per (job, generation, instance, step) and kind, and progress unchanged."""
    url = f"/api/v1/jobs/{world.job.pk}/metrics/"
    batch = [{"step": 1, "loss": 2.0, "generation": 0}, {"step": 2, "loss": 1.5, "generation": 0},
             {"step": 2, "val_loss": 1.7, "generation": 0}]
    first = world.agent_client.post(url, batch, format="json")
    assert first.status_code == 201 and first.json()["stored"] == 3
    again = world.agent_client.post(url, batch, format="json")
    assert again.status_code == 201 and again.json()["stored"] == 0
    assert again.json()["steps_done"] == 2 and again.json()["last_loss"] == 1.5
    # A batch that repeats itself, and a retried step overlapping a new one: only the new row lands.
    overlap = world.agent_client.post(url, [{"step": 2, "loss": 1.5, "generation": 0},
                                            {"step": 3, "loss": 1.2, "generation": 0},
                                            {"step": 3, "loss": 1.2, "generation": 0}], format="json")
    assert overlap.json()["stored"] == 1
    rows = MetricSample.objects.filter(job=world.job)
    assert sorted((r.step, r.val_loss is not None) for r in rows) == [(1, False), (2, False), (2, True), (3, False)]
    # The same step in the next generation (redone after a failure) is a new sample.
    redo = world.agent_client.post(url, [{"step": 3, "loss": 1.25, "generation": 1}], format="json")
    assert redo.json()["stored"] == 1


def test_the_database_refuses_a_repeated_sample(world):
    """The unique constraints back the service up, on SQLite and PostgreSQL alike."""
    from django.db import IntegrityError, transaction

    sample = {"job": world.job, "generation": 0, "instance": world.instance, "step": 4, "at": timezone.now()}
    MetricSample.objects.create(loss=1.0, **sample)
    MetricSample.objects.create(val_loss=1.1, **sample)  # the validation row of the same step is another kind
    with pytest.raises(IntegrityError), transaction.atomic():
        MetricSample.objects.create(loss=1.0, **sample)
