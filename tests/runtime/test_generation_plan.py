"""The generation plan is a typed value on the wire (`runtime.distributed.generation_plan`): every
plan `make_plan` makes comes back from its JSON equal, and a malformed plan read from the store is
an error naming the field, not a KeyError somewhere in the trainer."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runtime.distributed.coordinator import Coordinator, connect, serve
from runtime.distributed.generation_plan import GenerationPlan, PlanWireError
from runtime.distributed.membership import initial_plan, make_plan, plan_for_fleet
from runtime.distributed.published_layout import PublishedLayout
from runtime.strategies.base import full_slots
from tests.runtime.conftest import small_config


def _record(committed: int, layers: list[int], leaving: bool = False) -> dict:
    return {"committed": committed, "versions": {str(layer): committed for layer in layers}, "leaving": leaving}


def _plans() -> list[GenerationPlan]:
    """One plan of each kind: generation 0, a hand-over with a transfer, a wait, an error, a restart."""
    recycle = small_config(strategy="recycle", recycle_spill=False)
    first = initial_plan(recycle, started_at=12.5)
    alive = {0: _record(4, [0, 1, 2], leaving=True), 1: _record(4, [3]), 3: _record(4, [3])}
    deferred = make_plan(recycle, generation=1, previous=first, alive=alive, joiners=[], checkpoint_step=None,
                         reason="notice")
    handed = make_plan(recycle, generation=2, previous=deferred, alive=alive, joiners=[4], checkpoint_step=None,
                       reason="join", now=20.0)
    restarts = small_config(strategy="checkpoint")
    waiting = make_plan(restarts, generation=1, previous=initial_plan(restarts), alive={0: _record(2, [])},
                        joiners=[], checkpoint_step=2, reason="failure")
    lost = plan_for_fleet(small_config(strategy="none"), full_slots(small_config(strategy="none")), gone={1, 3},
                          noticed=set())
    return [first, deferred, dataclasses.replace(handed, skipped_at=[1]), waiting, lost]


def test_every_kind_of_plan_comes_back_from_its_json_equal() -> None:
    plans = _plans()
    assert [p.runs for p in plans] == [True, True, True, False, False]
    assert plans[2].transfers and plans[3].waiting and plans[4].error  # the kinds are what they say
    for plan in plans:
        assert GenerationPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_the_wire_reads_every_field_the_plan_has() -> None:
    wire = _plans()[2].to_dict()
    assert set(wire) == {f.name for f in dataclasses.fields(GenerationPlan)} - {"waiting", "error"}


@pytest.mark.parametrize("change,field", [
    ({"generation": "2"}, "generation"),
    ({"members": [0, "1"]}, "members"),
    ({"transfers": [[0, 1]]}, "transfers"),
    ({"slots": [0, 1]}, "slots"),
    ({"layout": {"stages": []}}, "layout"),
    ({"reason": 3}, "reason"),
    ({"started_at": "noon"}, "started_at"),
    ({"restore_step": True}, "restore_step"),
    ({"rolled_back": 1}, "rolled_back"),
])
def test_a_malformed_plan_is_an_error_naming_the_field(change: dict, field: str) -> None:
    wire = {**_plans()[2].to_dict(), **change}
    with pytest.raises(PlanWireError) as caught:
        GenerationPlan.from_dict(wire)
    assert caught.value.field == field and field in str(caught.value)


def test_a_plan_without_its_generation_or_not_an_object_is_refused() -> None:
    wire = _plans()[0].to_dict()
    del wire["generation"]
    with pytest.raises(PlanWireError, match="generation: missing"):
        GenerationPlan.from_dict(wire)
    with pytest.raises(PlanWireError, match="expected a JSON object"):
        GenerationPlan.from_dict([1, 2])


def test_a_malformed_plan_in_the_store_is_refused_where_it_is_read() -> None:
    store = serve(0)
    coord = Coordinator(connect(f"127.0.0.1:{store.port}"), "job-wire")
    plan = _plans()[0]
    assert coord.publish_plan(0, plan) == plan and coord.read_plan(0) == plan
    coord.store.set("gen/1/plan", json.dumps({**plan.to_dict(), "generation": 1, "members": "all"}))
    with pytest.raises(PlanWireError, match="members"):
        coord.read_plan(1)


def _published() -> PublishedLayout:
    return PublishedLayout(strategy="recycle", dp=2, pp=2, slots=[[11, 12], [None, 14]], decision="recycle",
                           holes=[(1, 0)], nodes=[(11, 0), (12, 1), (14, 3)], rendezvous="10.0.0.5:29400")


def test_the_published_layout_comes_back_from_its_json_equal() -> None:
    layout = _published()
    assert PublishedLayout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert layout.initial_nodes == 4 and layout.node_ids() == {11: 0, 12: 1, 14: 3}


@pytest.mark.parametrize("change,field", [
    ({"dp": 0}, "layout.dp"),
    ({"pp": "2"}, "layout.pp"),
    ({"slots": [[11, "12"]]}, "layout.slots"),
    ({"nodes": [[11]]}, "layout.nodes"),
    ({"restart_from_checkpoint": "no"}, "layout.restart_from_checkpoint"),
    ({"rendezvous": None}, "layout.rendezvous"),
    ({"stage_layers": [3, 3]}, "layout.stage_layers"),
])
def test_a_malformed_published_layout_is_an_error_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(PlanWireError) as caught:
        PublishedLayout.from_dict({**_published().to_dict(), **change})
    assert caught.value.field == field
    wire = _published().to_dict()
    del wire["strategy"]
    with pytest.raises(PlanWireError, match=r"layout\.strategy: missing"):
        PublishedLayout.from_dict(wire)
