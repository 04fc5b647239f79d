"""A drained batch of notices decides and applies its reconfigurations together (a constant number
of statements per batch) with the same end state as deciding and applying them one after another:
same generations, plans, decisions, decision inputs, job statuses, timelines and alerts."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from controlplane.fleet.models import Instance, InterruptionNotice, NoticeKind, NoticeSource, NoticeStatus
from controlplane.fleet.notices import NoticeDraft, notices_store
from controlplane.fleet.services import instance_transition
from controlplane.jobs.models import JobEvent, JobGeneration, Reconfiguration, TrainingJob
from controlplane.orchestration import services, tasks
from controlplane.orchestration.notices import notice_process, notices_process_batch
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.services import generations
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertDelivery
from tests.controlplane.factories import make_instance, make_job, make_team
from tests.orchestration.fakes import FakeProvider

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _worker(monkeypatch, settings):
    """As in the drain task: reconfigurations are applied inline on commit; the tasks the services
    enqueue are recorded rather than published."""
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the alert URL is on loopback
    provider = FakeProvider()
    set_provider("local", provider)
    monkeypatch.setattr(generations, "_in_worker", lambda: True)
    enqueued: list[tuple] = []
    for name in ("apply_reconfiguration", "instance_joined", "reconcile_job"):
        monkeypatch.setattr(getattr(tasks, name), "delay", lambda *args, name=name: enqueued.append((name, *args)))
    yield enqueued
    set_provider("local", None)


@dataclass
class World:
    team: object
    jobs: dict[str, TrainingJob] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)  # instance pk -> "job:index"
    provider_ids: dict[str, str] = field(default_factory=dict)  # provider id -> label
    notice_ids: list[int] = field(default_factory=list)
    notice_labels: dict[int, str] = field(default_factory=dict)


def _started(world: World, name: str, strategy: str) -> list[Instance]:
    """A job of 2 x 2 nodes, all running, generation 1 published."""
    job = make_job(world.team, strategy=strategy, target_steps=10, plan={"dp": 2, "pp": 2, "provider": "local"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    key = services.acquisition_enroll_key(acquisition=acquisition)
    instances = list(Instance.objects.filter(job=job).order_by("id"))
    for instance in instances:
        services.agent_enroll(enroll_key=key, provider_instance_id=instance.provider_instance_id)
    services.job_grow(job=job)
    world.jobs[name] = job
    return instances


def _world() -> World:
    """Four jobs and a stream of notices that covers each outcome of applying a leave:
    - `two`: two nodes of one job leave (a0 twice: a warning, then the preemption), plus a
      rebalance that moves nothing;
    - `stage`: both nodes of stage 1 leave with notices, and recycle's spill re-routes their hops
      to survivors that fetch the stage's layers from them before they go;
    - `ckpt`: a checkpoint job restarts;
    - `fresh`: a job with no generation yet (nothing to apply);
    and a notice for an instance nobody knows."""
    world = World(team=make_team())
    alert_endpoint_create(team=world.team, url="http://127.0.0.1:9/hook")
    nodes = {
        name: _started(world, name, strategy)
        for name, strategy in (("two", "recycle"), ("stage", "recycle"), ("ckpt", "checkpoint"))
    }
    fresh_job = make_job(world.team, plan={"dp": 1, "pp": 1, "provider": "local"})
    fresh = make_instance(world.team, job=fresh_job, provider="local")
    for state in ("pending", "running"):
        instance_transition(instance=fresh, to=state)
    world.jobs["fresh"] = fresh_job
    nodes["fresh"] = [fresh]
    for name, instances in nodes.items():
        for index, instance in enumerate(instances):
            world.labels[instance.pk] = f"{name}:{index}"
            world.provider_ids[instance.provider_instance_id] = f"{name}:{index}"
    stream = [
        ("two", 0, NoticeKind.INTERRUPTION, "terminate"),
        ("stage", 1, NoticeKind.INTERRUPTION, "terminate"),
        ("two", 1, NoticeKind.REBALANCE, ""),
        ("ckpt", 0, NoticeKind.INTERRUPTION, "terminate"),
        ("two", 3, NoticeKind.INTERRUPTION, "terminate"),
        ("fresh", 0, NoticeKind.INTERRUPTION, "terminate"),
        ("stage", 3, NoticeKind.INTERRUPTION, "terminate"),
        ("two", 0, NoticeKind.PREEMPTED, "preempted"),
        (None, 0, NoticeKind.INTERRUPTION, "terminate"),
    ]
    drafts = []
    for n, (name, index, kind, action) in enumerate(stream):
        provider_id = nodes[name][index].provider_instance_id if name else f"i-nobody-{world.team.pk}"
        drafts.append(
            NoticeDraft(
                team_id=world.team.pk,
                source=NoticeSource.GENERIC,
                kind=kind,
                action=action,
                dedup_key=f"{world.team.pk}:test:{n}",
                provider_instance_id=provider_id,
            )
        )
    stored = notices_store(drafts=drafts)
    world.notice_ids = [stored.stored[d.dedup_key] for d in drafts]
    world.notice_labels = {pk: f"n{n}" for n, pk in enumerate(world.notice_ids)}
    return world


def _relabel(world: World, value):
    """`value` with instance ids, provider ids and notice ids replaced by the world's labels, and
    the times (which differ from run to run) left out."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("decided_at", "lead_time_s", "received_at", "event_time", "created_at"):
                continue
            if key in ("instance", "id") and isinstance(item, int):
                out[key] = world.labels.get(item, item)
            elif key == "notice" and isinstance(item, int):
                out[key] = world.notice_labels[item]
            elif key == "notice" and isinstance(item, dict):
                out[key] = {**_relabel(world, item), "id": world.notice_labels[item["id"]]}
            elif key == "instances":
                out[key] = [world.labels[i] for i in item]
            elif key == "acquisition":
                out[key] = "acquisition"
            else:
                out[key] = _relabel(world, item)
        return out
    if isinstance(value, list | tuple):
        return [_relabel(world, item) for item in value]
    if isinstance(value, str):
        # A generation's reason names the leaving instances: "notice [12, 15]: reroute".
        value = re.sub(
            r"(notice|death) \[([\d, ]+)\]",
            lambda m: f"{m.group(1)} {sorted(world.labels[int(i)] for i in m.group(2).split(', '))}",
            value,
        )
        return re.sub(r"[\w.-]+", lambda m: world.provider_ids.get(m.group(0), m.group(0)), value)
    return value


def _layout(world: World, layout: dict) -> dict:
    out = _relabel(world, layout)
    out["slots"] = [[world.labels.get(i) for i in row] for row in layout.get("slots", [])]
    out["nodes"] = sorted([world.labels[i], n] for i, n in layout.get("nodes", []))
    return out


def _end_state(world: World) -> dict:
    state: dict = {}
    for name, job in world.jobs.items():
        job.refresh_from_db()
        state[name] = {
            "job": (job.status, _relabel(world, job.status_message), job.current_generation),
            "generations": [
                (g.number, _relabel(world, g.membership), _layout(world, g.layout), _relabel(world, g.reason))
                for g in JobGeneration.objects.filter(job=job).order_by("number")
            ],
            "reconfigurations": sorted(
                (
                    world.labels[r.instance_id],
                    r.trigger,
                    r.strategy,
                    world.notice_labels.get(r.notice_id),
                    r.status,
                    r.decision,
                    r.from_generation,
                    r.to_generation,
                    r.lost_seconds,
                    repr(_relabel(world, r.decision_input)),
                )
                for r in Reconfiguration.objects.filter(job=job)
            ),
            "timeline": Counter(
                (e.kind, _relabel(world, e.message), repr(_relabel(world, e.data)))
                for e in JobEvent.objects.filter(job=job)
            ),
        }
    state["instances"] = {
        world.labels[pk]: s for pk, s in Instance.objects.filter(team=world.team).values_list("pk", "state")
    }
    state["notices"] = [
        (world.notice_labels[n.pk], n.status, n.unknown_instance, world.labels.get(n.instance_id))
        for n in InterruptionNotice.objects.filter(pk__in=world.notice_ids).order_by("id")
    ]
    state["alerts"] = [
        (d.event, _relabel(world, d.payload.get("data", {}).get("message")))
        for d in AlertDelivery.objects.filter(endpoint__team=world.team).order_by("id")
    ]
    return state


def _one_after_another(world: World, capture) -> None:
    """The reference: each notice is processed in turn as a batch of one (one reconfiguration row
    each), and each reconfiguration is applied in turn once they commit (its own transaction each),
    as the notice processor did before reconfigurations were batched."""
    with capture(execute=True), transaction.atomic():
        for notice_id in world.notice_ids:
            notice_process(notice_id=notice_id)


def _as_one_batch(world: World, capture) -> None:
    with capture(execute=True):
        assert notices_process_batch(notice_ids=world.notice_ids) == (len(world.notice_ids), 0)


def test_a_batch_ends_where_one_after_another_ends(django_capture_on_commit_callbacks, monkeypatch):
    reference = _world()
    _one_after_another(reference, django_capture_on_commit_callbacks)
    batched = _world()
    applied_together: list[int] = []
    real_apply = services.reconfigurations_apply

    def spy(*, reconfigurations):
        applied_together.append(len(reconfigurations))
        return real_apply(reconfigurations=reconfigurations)

    monkeypatch.setattr(generations, "reconfigurations_apply", spy)
    _as_one_batch(batched, django_capture_on_commit_callbacks)
    # The batch's own path, not the one-by-one fallback: its six new rows applied in one call.
    assert applied_together == [6]
    expected = _end_state(reference)
    assert _end_state(batched) == expected

    # What that end state is: two nodes of one job leaving in one batch give one new generation
    # without either of them (the first apply already sees both gone; the second has nothing left
    # to do), not two.
    two = expected["two"]
    assert two["job"][2] == 2 and len(two["generations"]) == 2
    assert [m["instance"] for m in two["generations"][-1][1]] == ["two:1", "two:2"]
    assert [(r[0], r[5], r[7]) for r in two["reconfigurations"]] == [("two:0", "reroute", 2), ("two:3", "none", None)]
    # Both holders of stage 1 leave with a notice: survivors host its hops and fetch its layers
    # from the leaving nodes before they go (the runtime's plan), so the job goes on, degraded.
    assert [r[5] for r in expected["stage"]["reconfigurations"]] == ["reroute", "none"]
    assert expected["stage"]["job"][0] == "recovering"
    assert [r[5] for r in expected["ckpt"]["reconfigurations"]] == ["restart"]
    assert [r[5] for r in expected["fresh"]["reconfigurations"]] == ["none"]
    assert expected["notices"][-1][2] is True  # the unknown instance
    assert [a[0] for a in expected["alerts"]] == ["job.recovering"] * 3  # two, stage, ckpt: once each

    # If applying the batch together fails (here: anything bigger than one), each is applied on its
    # own, as a batch of one (there is one apply path): the same end state.
    def broken(*, reconfigurations):
        if len(reconfigurations) > 1:
            raise RuntimeError("batch apply failed")
        return real_apply(reconfigurations=reconfigurations)

    monkeypatch.setattr(generations, "reconfigurations_apply", broken)
    fallback = _world()
    _as_one_batch(fallback, django_capture_on_commit_callbacks)
    assert _end_state(fallback) == expected


def test_replayed_batch_decides_and_applies_nothing_twice(django_capture_on_commit_callbacks):
    world = _world()
    _as_one_batch(world, django_capture_on_commit_callbacks)
    before = _end_state(world)
    # The same notices again (a redelivered drain), and a direct re-apply of the batch's rows.
    InterruptionNotice.objects.filter(pk__in=world.notice_ids).update(status=NoticeStatus.ENQUEUED)
    _as_one_batch(world, django_capture_on_commit_callbacks)
    rows = list(Reconfiguration.objects.filter(job__team=world.team))
    assert services.reconfigurations_apply(reconfigurations=rows) == {}
    after = _end_state(world)
    for name in ("two", "stage", "ckpt", "fresh"):
        assert after[name]["generations"] == before[name]["generations"]
        assert after[name]["reconfigurations"] == before[name]["reconfigurations"]
    assert len(rows) == 6  # one per leaving node: two:0, two:3, stage:1, stage:3, ckpt:0, fresh:0


def _leave_batch_statements(team, count: int, tag: str, capture) -> int:
    """Statements of processing `count` interruption notices, each for its own running node of
    jobs of 8 with no generation yet (as in `python -m bench webhooks`), and of applying their new
    reconfigurations on commit."""
    jobs = [make_job(team) for _ in range((count + 7) // 8)]
    instances = []
    for n in range(count):
        instance = make_instance(team, job=jobs[n // 8], provider_instance_id=f"i-{tag}-{n}")
        for state in ("pending", "running"):
            instance_transition(instance=instance, to=state)
        instances.append(instance)
    stored = notices_store(
        drafts=[
            NoticeDraft(
                team_id=team.pk,
                source=NoticeSource.GENERIC,
                kind=NoticeKind.INTERRUPTION,
                action="terminate",
                dedup_key=f"{team.pk}:{tag}:{n}",
                provider_instance_id=i.provider_instance_id,
            )
            for n, i in enumerate(instances)
        ]
    )
    with CaptureQueriesContext(connection) as queries, capture(execute=True) as callbacks:
        assert notices_process_batch(notice_ids=list(stored.stored.values())) == (count, 0)
    # The batch's apply, and with Redis one wake-up of the moved nodes' held agent polls: per batch,
    # not per notice.
    assert len(callbacks) == 1 + bool(settings.REDIS_URL)
    assert Reconfiguration.objects.filter(job__in=jobs, status="applied", decision="none").count() == count
    return len(queries.captured_queries)


def test_deciding_and_applying_costs_the_same_statements_for_2_leaving_nodes_as_for_20(
    django_capture_on_commit_callbacks,
):
    team = make_team()
    small = _leave_batch_statements(team, 2, "small", django_capture_on_commit_callbacks)
    large = _leave_batch_statements(team, 20, "large", django_capture_on_commit_callbacks)
    assert large == small, (small, large)
