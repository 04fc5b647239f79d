"""Orchestration services: acquire once, detect deaths, react by strategy, grow back, release."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobGeneration, JobStatus, Reconfiguration
from controlplane.market.models import SpotPrice
from controlplane.orchestration import reactions, services
from controlplane.orchestration.models import Acquisition
from controlplane.orchestration.notices import notices_drain
from controlplane.orchestration.selectors import pools_ranked
from controlplane.webhooks.alerts import alert_endpoint_create
from controlplane.webhooks.models import AlertDelivery
from tests.controlplane.factories import make_instance_type, make_job, make_team, make_zone

# Silent nodes are stamped 2 minutes back against a 60 s timeout: on a loaded machine the test's own
# seconds must not make the live nodes (stamped just now) look silent too.
SILENCE_S = 60.0

pytestmark = pytest.mark.django_db


def _job(strategy: str = "recycle", dp: int = 2, pp: int = 2, **plan):
    return make_job(make_team(), strategy=strategy, target_steps=10,
                    plan={"dp": dp, "pp": pp, "provider": "local", **plan})


def _start(job, fake) -> list[Instance]:
    """Acquire, launch and enrol the job's nodes; return its instances in slot order."""
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    return _enroll_all(acquisition)


def _enroll_all(acquisition: Acquisition) -> list[Instance]:
    key = services.acquisition_enroll_key(acquisition=acquisition)
    instances = list(Instance.objects.filter(request_token__startswith=acquisition.request_token + "/").order_by("id"))
    for instance in instances:
        services.agent_enroll(enroll_key=key, provider_instance_id=instance.provider_instance_id)
    services.job_grow(job=acquisition.job)
    return instances


def _generation(job) -> JobGeneration:
    job.refresh_from_db()
    return JobGeneration.objects.get(job=job, number=job.current_generation)


def test_acquire_is_idempotent(fake):
    job = _job()
    acquisition = services.capacity_request(job=job)
    assert services.capacity_request(job=job) is None  # nothing missing any more

    services.acquisition_launch(acquisition=acquisition)
    services.acquisition_launch(acquisition=acquisition)  # the task ran twice

    assert Acquisition.objects.filter(job=job).count() == 1
    assert len(fake.launches) == 1 and fake.launches[0].count == 4
    instances = Instance.objects.filter(job=job)
    assert instances.count() == 4
    assert set(instances.values_list("state", flat=True)) == {InstanceState.PENDING}
    # job{pk}-acq{n}-{random}: unique across control planes sharing one cloud account.
    assert acquisition.request_token.startswith(f"job{job.pk}-acq1-") and len(acquisition.request_token) <= 64
    assert Acquisition.objects.filter(request_token__startswith=f"job{job.pk}-acq1-").count() == 1
    assert sorted(instances.values_list("request_token", flat=True)) == [
        f"{acquisition.request_token}/{i}" for i in range(4)]
    job.refresh_from_db()
    assert job.status == JobStatus.PROVISIONING
    assert set(job.events.values_list("kind", flat=True)) >= {"acquisition", "acquired", "job_provisioning"}


def test_enrolment_checks_the_key_and_waits_for_attachment(fake):
    from controlplane.common.errors import Conflict, DomainError

    job = _job(dp=1, pp=1)
    acquisition = services.job_start(job=job)
    key = services.acquisition_enroll_key(acquisition=acquisition)
    with pytest.raises(Conflict, match="not attached"):
        services.agent_enroll(enroll_key=key, provider_instance_id="fake-1")
    services.acquisition_launch(acquisition=acquisition)
    with pytest.raises(DomainError, match="enrolment key"):
        services.agent_enroll(enroll_key=key[:-2] + "xx", provider_instance_id="fake-1")
    instance, token = services.agent_enroll(enroll_key=key, provider_instance_id="fake-1")
    assert token.startswith("sp_") and instance.state == InstanceState.RUNNING
    assert instance.billing_segments.filter(end__isnull=True).count() == 1


def test_first_generation_once_all_nodes_run(fake):
    job = _job()
    instances = _start(job, fake)
    generation = _generation(job)
    assert generation.number == 1
    assert generation.layout["slots"] == [[instances[0].pk, instances[1].pk], [instances[2].pk, instances[3].pk]]
    assert [m["rank"] for m in generation.membership] == [0, 1, 2, 3]
    assert job.status == JobStatus.RUNNING
    assert services.job_grow(job=job) is None  # running it again publishes nothing


def test_silent_death_reroutes_then_replacement_grows_back(fake):
    job = _job()
    instances = _start(job, fake)
    dead = instances[1]
    Instance.objects.filter(job=job).update(last_heartbeat_at=timezone.now())
    Instance.objects.filter(pk=dead.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=120))

    assert services.instances_detect_dead(timeout_s=SILENCE_S) == [dead.pk]
    assert services.instances_detect_dead(timeout_s=SILENCE_S) == []  # once

    dead.refresh_from_db()
    assert dead.state == InstanceState.PREEMPTED
    generation = _generation(job)
    assert generation.number == 2
    assert generation.layout["slots"] == [[instances[0].pk, None], [instances[2].pk, instances[3].pk]]
    assert generation.layout["decision"] == "reroute"
    reconfiguration = Reconfiguration.objects.get(job=job, trigger="death")
    assert (reconfiguration.status, reconfiguration.to_generation) == ("applied", 2)
    # Stalled from the last heartbeat (120 s ago) to the new generation: what the cost report prices.
    assert 120.0 <= reconfiguration.lost_seconds < 240.0
    assert job.status == JobStatus.RECOVERING

    report = services.capacity_reconcile(job=job)
    assert report["requested"] == 1 and report["launched"] == 1
    replacement_acq = Acquisition.objects.filter(job=job).order_by("-id").first()
    assert replacement_acq.reason == "replacement"
    (replacement,) = _enroll_all(replacement_acq)

    generation = _generation(job)
    assert generation.number == 3
    assert generation.layout["slots"] == [[instances[0].pk, replacement.pk], [instances[2].pk, instances[3].pk]]
    assert job.status == JobStatus.RUNNING
    assert Reconfiguration.objects.get(job=job, trigger="join").to_generation == 3
    # Nothing is left to do: a second reconcile acquires nothing.
    again = services.capacity_reconcile(job=job)
    assert again["requested"] == 0 and Acquisition.objects.filter(job=job).count() == 2


def test_job_status_changes_reach_the_teams_alert_urls(fake, settings):
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the alert URL is on loopback
    job = _job()
    alert_endpoint_create(team=job.team, url="http://127.0.0.1:9/hook")
    instances = _start(job, fake)
    Instance.objects.filter(job=job).update(last_heartbeat_at=timezone.now())
    Instance.objects.filter(pk=instances[1].pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=120))
    services.instances_detect_dead(timeout_s=SILENCE_S)  # -> recovering
    (replacement,) = _enroll_all(_replacement(job))  # -> running again: recovered
    events = list(AlertDelivery.objects.filter(endpoint__team=job.team).order_by("id").values_list("event", flat=True))
    assert events == ["job.recovering", "job.recovered"]
    assert replacement.job_id == job.pk


def _silent_queries(fake, silent: int) -> tuple[int, object, list[Instance]]:
    """SQL statements of the dead-node check finding `silent` nodes of a started 8 x 2 recycle job
    (one per pipeline, stage 1) gone quiet; the job and the silent nodes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = _job(dp=8, pp=2)
    instances = _start(job, fake)
    quiet = instances[1 : 2 * silent : 2]
    Instance.objects.filter(job=job).update(last_heartbeat_at=timezone.now())
    quiet_since = timezone.now() - timedelta(seconds=120)
    Instance.objects.filter(pk__in=[i.pk for i in quiet]).update(last_heartbeat_at=quiet_since)
    with CaptureQueriesContext(connection) as queries:
        assert sorted(services.instances_detect_dead(timeout_s=SILENCE_S)) == sorted(i.pk for i in quiet)
    return len(queries), job, quiet


def test_nodes_that_go_silent_together_cost_their_job_one_generation(fake):
    """A zone that goes silent without notices: each node marked lost one by one published a
    generation of its own (16 generations in 0.95 s for 16 of 256 nodes, `python -m bench
    joblocks`), so the runtime regrouped again and again. Found together, they are one batch: a
    fixed number of statements, one new generation, each node preempted with its own event and
    reconfiguration (as a notice batch)."""
    few, _, _ = _silent_queries(fake, 2)
    many, job, quiet = _silent_queries(fake, 6)
    assert many == few, (few, many)
    generation = _generation(job)
    assert generation.number == 2
    assert not {i.pk for i in quiet} & set(reactions.alive(generation.layout["slots"]))
    for node in quiet:
        node.refresh_from_db()
        assert node.state == InstanceState.PREEMPTED
        assert job.events.filter(kind="instance_lost", data__instance=node.pk).count() == 1
        (reconfiguration,) = Reconfiguration.objects.filter(job=job, instance=node)
        assert (reconfiguration.trigger, reconfiguration.status) == ("death", "applied")
    # The first publishes the generation without every node that is gone; the others find it done.
    published = Reconfiguration.objects.filter(job=job, trigger="death").values_list("to_generation", flat=True)
    assert sorted(published, key=str) == sorted([2] + [None] * (len(quiet) - 1), key=str)
    assert services.instances_detect_dead(timeout_s=SILENCE_S) == []  # once


def test_nodes_the_provider_reports_gone_together_cost_one_generation(fake):
    job = _job(dp=4, pp=2)
    instances = _start(job, fake)
    gone = [instances[1], instances[3], instances[4]]
    for node in gone:
        fake.vanish(node.provider_instance_id)
    report = services.capacity_reconcile(job=job)
    assert sorted(report["lost"]) == sorted(i.pk for i in gone)
    generation = JobGeneration.objects.filter(job=job).order_by("number")
    assert [g.number for g in generation] == [1, 2]
    assert not {i.pk for i in gone} & set(reactions.alive(generation.last().layout["slots"]))


def test_launched_nodes_that_never_enrol_fail_after_the_enrolment_timeout(fake):
    """Launched nodes that never enrolled are given up together after `ENROLL_TIMEOUT` (their
    instances fail, one event each); nodes launched since are left to enrol."""
    job = _job(dp=2, pp=2)
    acquisition = services.job_start(job=job)
    nodes = services.acquisition_launch(acquisition=acquisition)
    old, young = nodes[:3], nodes[3]
    Instance.objects.filter(pk__in=[i.pk for i in old]).update(
        created_at=timezone.now() - services.ENROLL_TIMEOUT - timedelta(seconds=1))
    assert sorted(services.instances_detect_dead(timeout_s=2.0)) == sorted(i.pk for i in old)
    for node in old:
        node.refresh_from_db()
        assert node.state == InstanceState.FAILED and node.ended_at is not None
        assert node.events.filter(to_state=InstanceState.FAILED, detail__reason="never enrolled").count() == 1
    young.refresh_from_db()
    assert young.state == InstanceState.PENDING
    assert services.instances_detect_dead(timeout_s=2.0) == []


def _replacement(job) -> Acquisition:
    services.capacity_reconcile(job=job)
    return Acquisition.objects.filter(job=job, reason="replacement").latest("id")


def test_agent_notice_becomes_a_reconfiguration_without_the_leaving_node(fake):
    job = _job()
    instances = _start(job, fake)
    leaving = instances[2]
    deadline = timezone.now() + timedelta(seconds=120)
    first = services.agent_notice(instance=leaving, kind="interruption", action="terminate", deadline=deadline)
    assert services.agent_notice(instance=leaving, kind="interruption", action="terminate",
                                 deadline=deadline) is None  # duplicate
    assert InterruptionNotice.objects.get(pk=first).source == "agent"

    notices_drain()  # the fleet app's processing: instance -> notice, reconfiguration decided
    leaving.refresh_from_db()
    assert leaving.state == InstanceState.NOTICE
    assert services.reconfigurations_pending(job=job)
    services.capacity_reconcile(job=job)  # applies what was decided, and asks for a replacement

    generation = _generation(job)
    assert generation.number == 2
    assert leaving.pk not in {m["instance"] for m in generation.membership}
    reconfiguration = Reconfiguration.objects.get(job=job, trigger="notice")
    assert reconfiguration.decision == "reroute" and reconfiguration.notice_id == first
    assert reconfiguration.lost_seconds == 0.0  # re-routed before the node's deadline: nothing lost
    assert Acquisition.objects.filter(job=job, reason="replacement").count() == 1


def test_checkpoint_strategy_restarts(fake):
    job = _job(strategy="checkpoint")
    instances = _start(job, fake)
    reconfiguration = services.instance_mark_lost(instance=instances[0], reason="test")
    services.reconfiguration_apply(reconfiguration=reconfiguration)
    generation = _generation(job)
    assert generation.layout["decision"] == "restart"
    assert generation.layout["restart_from_checkpoint"] is True
    assert services.reconfiguration_apply(reconfiguration=reconfiguration) is None  # once


def test_recycle_with_spill_goes_on_while_a_spill_host_holds_the_lost_stage(fake):
    # The first loss spills stage-1 hops onto survivors, which then hold its layers: losing the
    # last slot holder of stage 1 leaves a copy, so the job goes on (as the runtime plans it).
    job = _job()
    instances = _start(job, fake)
    for instance in (instances[1], instances[3]):  # stage 1 of both pipelines
        reconfiguration = services.instance_mark_lost(instance=instance, reason="test")
        services.reconfiguration_apply(reconfiguration=reconfiguration)
    job.refresh_from_db()
    assert job.current_generation == 3
    assert list(Reconfiguration.objects.filter(job=job).values_list("decision", flat=True)) == ["reroute"] * 2


def test_recycle_fails_when_every_copy_of_a_stage_is_lost(fake):
    # As the runtime decides (runtime.distributed.membership.make_plan): recycle keeps no checkpoint, so once
    # both holders of stage 1 died its layers are gone and no replacement can bring them back.
    job = _job(runtime={"recycle_spill": False})
    instances = _start(job, fake)
    for instance in (instances[1], instances[3]):  # stage 1 of both pipelines
        reconfiguration = services.instance_mark_lost(instance=instance, reason="test")
        services.reconfiguration_apply(reconfiguration=reconfiguration)
    job.refresh_from_db()
    assert job.current_generation == 2  # the first loss re-routed; the second cannot
    failed = Reconfiguration.objects.get(job=job, decision="fail")
    assert failed.instance_id == instances[3].pk
    assert job.status == JobStatus.FAILED and "no surviving node for stage 1" in job.status_message


def test_provider_drift_is_repaired(fake):
    job = _job(dp=2, pp=1)
    instances = _start(job, fake)
    fake.vanish(instances[0].provider_instance_id)
    report = services.capacity_reconcile(job=job)
    assert report["lost"] == [instances[0].pk]
    assert report["requested"] == 1
    instances[0].refresh_from_db()
    assert instances[0].state == InstanceState.PREEMPTED


def test_finished_job_releases_everything(fake):
    job = _job(dp=1, pp=2)
    instances = _start(job, fake)
    job.refresh_from_db()
    job.steps_done = job.target_steps
    job.save(update_fields=["steps_done"])
    report = services.capacity_reconcile(job=job)
    assert sorted(report["released"]) == sorted(i.pk for i in instances)
    assert sorted(fake.terminated) == sorted(i.provider_instance_id for i in instances)
    job.refresh_from_db()
    assert job.status == JobStatus.FINISHED
    assert not Instance.objects.filter(job=job, state__in=["running", "pending"]).exists()
    assert all(s.end is not None for i in instances for s in i.billing_segments.all())


def test_a_release_and_its_event_commit_together(fake, monkeypatch):
    """The nodes' ends and the timeline's "released" event are one transaction: a failure between
    them leaves every node live, and the next reconcile releases them with the event (seen in CI:
    a reader saw every node terminated before the event existed)."""
    from controlplane.orchestration.services import reconcile

    job = _job(dp=1, pp=2)
    instances = _start(job, fake)
    job.refresh_from_db()
    job.status = JobStatus.CANCELLED
    job.save(update_fields=["status"])

    def event_fails(**kwargs):
        raise RuntimeError("the event's write failed")

    monkeypatch.setattr(reconcile, "job_record_event", event_fails)
    with pytest.raises(RuntimeError):
        services.capacity_release(job=job)
    assert Instance.objects.filter(job=job, state=InstanceState.RUNNING).count() == len(instances)
    assert not job.events.filter(kind="released").exists()

    monkeypatch.undo()
    assert sorted(services.capacity_release(job=job)) == sorted(i.pk for i in instances)
    assert not Instance.objects.filter(job=job, state=InstanceState.RUNNING).exists()
    (event,) = job.events.filter(kind="released")
    assert sorted(event.data["instances"]) == sorted(i.pk for i in instances)
    assert services.capacity_release(job=job) == []  # nothing left: no second event
    assert job.events.filter(kind="released").count() == 1


def test_a_release_keeps_the_rendezvous_store_of_a_job_resumed_meanwhile(fake, monkeypatch):
    """A resume can land between an ended job's node release and its store's release (`bench money`'s
    third budget trial: resumed 40 ms after "released", its launch was handed the old store, which
    the release then stopped, and no generation ever formed). The store is retired only while the
    job is still over, under its lock; a job still over loses it."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.orchestration.models import Rendezvous
    from controlplane.orchestration.services import reconcile

    real_provider = reconcile.get_provider

    class ResumedWhileTerminating:
        def __init__(self, kind: str) -> None:
            self.real = real_provider(kind)

        def terminate(self, ids: list[str]) -> None:
            self.real.terminate(ids)
            TrainingJob.objects.filter(pk=resumed.pk).update(status=JobStatus.PENDING)

    resumed, ended = _job(dp=1, pp=2), _job(dp=1, pp=2)
    for job in (resumed, ended):
        instances = _start(job, fake)
        Rendezvous.objects.create(job=job, address="127.0.0.1:1", created_at=timezone.now())
        TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.STOPPED)
        job.refresh_from_db()
    monkeypatch.setattr(reconcile, "get_provider", ResumedWhileTerminating)
    assert len(services.capacity_release(job=resumed)) == 2
    assert Rendezvous.objects.get(job=resumed).released_at is None  # its new nodes meet there
    monkeypatch.undo()
    store = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands in for the store's process
    Rendezvous.objects.filter(job=ended).update(pid=store.pid)
    assert sorted(services.capacity_release(job=ended)) == sorted(i.pk for i in instances)
    assert store.wait(timeout=10) != 0  # ended by the release, which returned once it was gone
    row = Rendezvous.objects.get(job=ended)
    assert row.released_at is not None and row.pid is None  # a reused pid is never signalled later


def _release_queries(fake, dp: int) -> tuple[int, Instance]:
    """SQL statements of releasing a started, cancelled job of dp x 2 nodes, and one of its nodes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = _job(dp=dp, pp=2)
    instances = _start(job, fake)
    job.refresh_from_db()
    job.status = JobStatus.CANCELLED
    job.save(update_fields=["status"])
    with CaptureQueriesContext(connection) as queries:
        assert len(services.capacity_release(job=job)) == len(instances)
    return len(queries), instances[-1]


def test_a_release_ends_its_nodes_in_bulk_whatever_their_number(fake):
    """A job's release holds its lock while it ends the nodes: statements per node made that 6 s
    for 1,024 nodes on PostgreSQL. It is a fixed number of statements now, with every node ended as
    one by one was: its state event, its billing closed at its end, its agent token revoked."""
    few, _ = _release_queries(fake, dp=1)
    many, node = _release_queries(fake, dp=8)
    assert many == few, (few, many)
    node.refresh_from_db()
    assert node.state == InstanceState.TERMINATED and node.ended_at is not None
    assert node.events.filter(kind="state", to_state=InstanceState.TERMINATED).count() == 1
    assert [s.end for s in node.billing_segments.all()] == [node.ended_at]
    assert not node.agent_tokens.filter(revoked_at__isnull=True).exists()


def _acquisition_queries(dp: int) -> tuple[int, int, list[Instance]]:
    """SQL statements of a dp x 2 job's capacity request and of its launch and attach, and its nodes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = _job(dp=dp, pp=2)
    with CaptureQueriesContext(connection) as requested:
        acquisition = services.job_start(job=job)
    with CaptureQueriesContext(connection) as launched:
        nodes = services.acquisition_launch(acquisition=acquisition)
    assert len(nodes) == dp * 2
    return len(requested), len(launched), nodes


def test_a_start_requests_and_attaches_its_nodes_in_bulk_whatever_their_number(fake):
    """Requesting a job's nodes and attaching the launched ones each hold the job's lock: one
    insert, then a round of statements a node, held a 128-node job's lock for 1.4 s on PostgreSQL
    (`python -m bench joblocks`). Each is a fixed number of statements now, and every node ends as
    one by one did: its provider id, pending, one state event for the move."""
    _acquisition_queries(dp=1)  # the first one in a process also fills caches (the catalogue's rows)
    few = _acquisition_queries(dp=1)
    many = _acquisition_queries(dp=8)
    assert many[:2] == few[:2], (few[:2], many[:2])
    for node in many[2]:
        node.refresh_from_db()
        assert node.state == InstanceState.PENDING and node.provider_instance_id in fake.nodes
        assert list(node.events.values_list("from_state", "to_state")) == [
            (InstanceState.REQUESTED, InstanceState.PENDING)]
    assert len({n.provider_instance_id for n in many[2]}) == len(many[2])


def test_nodes_the_provider_did_not_launch_fail_together(fake, monkeypatch):
    """A launch that came back short: the instances left without a node fail (one event each),
    the others are attached."""
    job = _job(dp=2, pp=2)
    acquisition = services.job_start(job=job)
    launch = fake.launch
    monkeypatch.setattr(fake, "launch", lambda request: launch(request)[:1])
    attached = services.acquisition_launch(acquisition=acquisition)
    assert len(attached) == 1
    states = sorted(Instance.objects.filter(job=job).values_list("state", flat=True))
    assert states == sorted([InstanceState.PENDING] + [InstanceState.FAILED] * 3)
    for failed in Instance.objects.filter(job=job, state=InstanceState.FAILED):
        assert failed.ended_at is not None
        (event,) = failed.events.all()
        assert event.detail == {"reason": "provider launched fewer nodes"}


def test_cheapest_pool_first_and_a_pool_that_just_preempted_us_is_avoided():
    team = make_team()
    itype = make_instance_type("p3.2xlarge")
    a, b = make_zone("us-east-1a", "use1-az1"), make_zone("us-east-1b", "use1-az2")
    now = timezone.now()
    SpotPrice.objects.create(instance_type=itype, zone=a, price=Decimal("0.90"), timestamp=now)
    SpotPrice.objects.create(instance_type=itype, zone=b, price=Decimal("1.20"), timestamp=now)
    SpotPrice.objects.create(instance_type=itype, zone=b, price=Decimal("0.50"), timestamp=now - timedelta(hours=1))
    job = make_job(team, plan={"provider": "aws", "pools": [{"instance_type": "p3.2xlarge", "zone": "us-east-1b"},
                                                            {"instance_type": "p3.2xlarge", "zone": "us-east-1a"}]})
    ranked = pools_ranked(job=job)
    assert [(p.zone, p.price) for p in ranked.usable] == [("us-east-1a", Decimal("0.90")),
                                                         ("us-east-1b", Decimal("1.20"))]
    assert ranked.cooling == []

    Instance.objects.create(team=team, job=job, provider="aws", instance_type=itype, zone=a,
                            provider_instance_id="i-0aaa", state=InstanceState.PREEMPTED, ended_at=now)
    ranked = pools_ranked(job=job)
    assert [p.zone for p in ranked.usable] == ["us-east-1b"]
    assert [p.zone for p in ranked.cooling] == ["us-east-1a"]
