"""Capacity errors fail over at once: the offering is marked unavailable for every team, the same
launch goes on with the next pools, partial nodes are kept, and no launch asks a marked offering
before its mark expires."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.orchestration import services
from controlplane.orchestration.models import Acquisition, AcquisitionStatus, UnavailableOffering
from controlplane.orchestration.offerings import NO_CAPACITY, PREEMPTED, unavailable_offerings
from controlplane.orchestration.services.catalogue import _instance_type_row, _zone_row
from tests.controlplane.factories import make_job, make_team

pytestmark = pytest.mark.django_db

CHEAP, NEXT, DEAR = "local.node@local", "local.node@local-b", "local.node@local-c"


def _priced_job(team=None, *, nodes: int = 4):
    """A local job over three pools priced 0.10 < 0.20 < 0.30 USD/h."""
    from controlplane.market.models import SpotPrice

    itype = _instance_type_row("local", "local.node")
    now = timezone.now()
    for zone, price in (("local", "0.10"), ("local-b", "0.20"), ("local-c", "0.30")):
        SpotPrice.objects.get_or_create(instance_type=itype, zone=_zone_row("local", zone), timestamp=now,
                                        defaults={"price": Decimal(price)})
    return make_job(team or make_team(), target_steps=10,
                    plan={"dp": nodes, "pp": 1, "provider": "local", "zones": ["local-c", "local-b", "local"]})


def _launch(job) -> Acquisition:
    acquisition = services.capacity_request(job=job)
    services.acquisition_launch(acquisition=acquisition)
    acquisition.refresh_from_db()
    return acquisition


def test_a_capacity_error_fails_over_to_the_next_pool_in_the_same_launch(fake):
    fake.no_capacity[CHEAP] = ("InsufficientInstanceCapacity", 0)
    job = _priced_job()

    acquisition = _launch(job)

    assert [r.pools[0].key for r in fake.launches] == [CHEAP, NEXT]
    assert [r.client_token for r in fake.launches] == [acquisition.request_token, f"{acquisition.request_token}.2"]
    assert acquisition.status == AcquisitionStatus.FULFILLED and acquisition.launched == 4
    assert acquisition.failed_pools[0]["pools"] == [CHEAP]
    assert acquisition.failed_pools[0]["code"] == "InsufficientInstanceCapacity"
    zones = set(Instance.objects.filter(job=job).values_list("zone__code", flat=True))
    assert zones == {"local-b"}
    mark = UnavailableOffering.objects.get()
    assert (mark.provider, mark.instance_type, mark.zone, mark.capacity_type) == (
        "local", "local.node", "local", "spot")
    assert timedelta(seconds=179) < mark.until - mark.marked_at <= timedelta(seconds=180)


def test_partial_fulfilment_is_kept_and_the_rest_asked_elsewhere(fake):
    fake.no_capacity[CHEAP] = ("InsufficientInstanceCapacity", 1)
    job = _priced_job()

    acquisition = _launch(job)

    assert [(r.pools[0].key, r.count) for r in fake.launches] == [(CHEAP, 4), (NEXT, 3)]
    assert acquisition.launched == 4
    by_zone = sorted(Instance.objects.filter(job=job).values_list("zone__code", flat=True))
    assert by_zone == ["local", "local-b", "local-b", "local-b"]
    assert set(Instance.objects.filter(job=job).values_list("state", flat=True)) == {InstanceState.PENDING}


def test_a_marked_offering_is_skipped_by_every_team_until_its_mark_expires(fake, settings):
    settings.SPOTPIPE_CAPACITY_UNAVAILABLE_S = 60.0
    fake.no_capacity[CHEAP] = ("VcpuLimitExceeded", 0)
    _launch(_priced_job())
    del fake.no_capacity[CHEAP]
    fake.launches.clear()

    other = _priced_job(make_team())  # another team, same offering
    acquisition = services.capacity_request(job=other)
    assert [p["zone"] for p in acquisition.pools] == ["local-b", "local-c"]
    assert CHEAP in {f"{p['instance_type']}@{p['zone']}" for p in acquisition.avoided_pools}
    services.acquisition_launch(acquisition=acquisition)
    assert [r.pools[0].key for r in fake.launches] == [NEXT]

    # Past the TTL the cheap pool is asked first again.
    UnavailableOffering.objects.update(until=timezone.now() - timedelta(seconds=1))
    third = _priced_job(make_team())
    assert services.capacity_request(job=third).pools[0]["zone"] == "local"


def test_every_offering_out_of_capacity_waits_and_says_so_once(fake):
    for key in (CHEAP, NEXT, DEAR):
        fake.no_capacity[key] = ("InsufficientInstanceCapacity", 0)
    job = _priced_job()

    acquisition = _launch(job)

    assert [r.pools[0].key for r in fake.launches] == [CHEAP, NEXT, DEAR]
    assert acquisition.status == AcquisitionStatus.FAILED and acquisition.launched == 0
    assert set(Instance.objects.filter(job=job).values_list("state", flat=True)) == {InstanceState.FAILED}
    # The next reconciles launch nothing (every offering is marked) and the timeline says so once.
    fake.launches.clear()
    services.capacity_reconcile(job=job)
    services.capacity_reconcile(job=job)
    assert fake.launches == []
    assert job.events.filter(kind="capacity_wait").count() == 1
    assert Acquisition.objects.filter(job=job).count() == 1


def test_a_retried_launch_resumes_at_its_round_and_adopts_its_nodes(fake):
    fake.no_capacity[CHEAP] = ("InsufficientInstanceCapacity", 0)
    job = _priced_job()
    acquisition = services.capacity_request(job=job)
    services.acquisition_launch(acquisition=acquisition)
    # The task runs again (say its worker died after the launch): the same round's token, no new node.
    Acquisition.objects.filter(pk=acquisition.pk).update(status=AcquisitionStatus.REQUESTED)
    before = len(fake.nodes)
    services.acquisition_launch(acquisition=acquisition)
    assert len(fake.nodes) == before
    assert fake.launches[-1].client_token == f"{acquisition.request_token}.2"


def test_unavailable_offerings_lists_both_reasons_with_their_expiry(fake):
    fake.no_capacity[CHEAP] = ("InsufficientInstanceCapacity", 0)
    job = _priced_job()
    _launch(job)
    node = Instance.objects.filter(job=job).first()
    Instance.objects.filter(pk=node.pk).update(state=InstanceState.PREEMPTED, ended_at=timezone.now())

    listed = unavailable_offerings(team_id=job.team_id)
    assert {(u.pool_key, u.reason) for u in listed} == {(CHEAP, NO_CAPACITY), (NEXT, PREEMPTED)}
    assert all(u.until > timezone.now() for u in listed)
    # Another team sees the capacity mark, not this team's cool-down.
    assert {u.reason for u in unavailable_offerings(team_id=make_team().pk)} == {NO_CAPACITY}


def test_the_api_lists_unavailable_offerings_with_their_expiry(fake):
    from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client

    fake.no_capacity[CHEAP] = ("InsufficientInstanceCapacity", 0)
    job = _priced_job()
    _launch(job)
    api = token_client(make_api_token(job.team, user=make_api_user(job.team)))

    body = api.get("/api/v1/offerings/unavailable/").json()
    assert body["count"] == 1
    (row,) = body["results"]
    assert (row["pool"], row["reason"], row["code"], row["capacity_type"]) == (
        CHEAP, "no_capacity", "InsufficientInstanceCapacity", "spot")
    assert row["until"] > timezone.now().isoformat()[:19]
    assert api.get("/api/v1/offerings/unavailable/?provider=aws").json()["count"] == 0
    bad = api.get("/api/v1/offerings/unavailable/?provider=gcp")
    assert bad.status_code == 400 and "provider" in bad.json()["errors"]



def test_a_jobs_nodes_stay_in_one_region(monkeypatch):
    """Across regions a launch goes to the cheapest usable region; a job that holds nodes grows back
    only in theirs (and waits there when it has no capacity: moving is a restart, not a top-up)."""
    from controlplane.market.models import SpotPrice
    from controlplane.orchestration.providers import set_provider
    from tests.controlplane.factories import make_instance_type, make_zone
    from tests.orchestration.fakes import FakeProvider

    monkeypatch.setenv("SPOTPIPE_AWS_REGIONS", "us-east-1,us-west-2")
    fake = FakeProvider()
    set_provider("aws", fake)
    try:
        itype = make_instance_type("p3.2xlarge")
        east, west = make_zone("us-east-1a", "use1-az1"), make_zone("us-west-2a", "usw2-az1")
        now = timezone.now()
        SpotPrice.objects.create(instance_type=itype, zone=east, price=Decimal("0.95"), timestamp=now)
        SpotPrice.objects.create(instance_type=itype, zone=west, price=Decimal("0.90"), timestamp=now)
        job = make_job(make_team(), target_steps=10, plan={"dp": 2, "pp": 1, "provider": "aws",
                                                           "instance_types": ["p3.2xlarge"],
                                                           "zones": ["us-east-1a", "us-west-2a"]})
        first = _launch(job)
        assert [(p["zone"], p["region"]) for p in first.pools] == [("us-west-2a", "us-west-2")]
        assert fake.launches[0].region == "us-west-2"

        # East becomes cheaper, a west node vanishes: the replacement is still asked in the west.
        SpotPrice.objects.create(instance_type=itype, zone=east, price=Decimal("0.50"),
                                 timestamp=now + timedelta(seconds=1))
        fake.vanish(Instance.objects.filter(job=job).first().provider_instance_id)
        services.capacity_reconcile(job=job)
        replacement = Acquisition.objects.filter(job=job).order_by("-id").first()
        assert replacement.pk != first.pk and [p["zone"] for p in replacement.pools] == ["us-west-2a"]

        # The west runs out: the job waits in its region, the cheap east is not asked.
        fake.vanish(Instance.objects.filter(job=job, state="pending").first().provider_instance_id)
        fake.no_capacity["p3.2xlarge@us-west-2a"] = ("InsufficientInstanceCapacity", 0)
        fake.launches.clear()
        services.capacity_reconcile(job=job)
        services.capacity_reconcile(job=job)
        assert {r.region for r in fake.launches} == {"us-west-2"}
        assert job.events.filter(kind="capacity_wait").exists()
    finally:
        set_provider("aws", None)
