"""A job the control plane plans itself (plan.auto) on real instance types states what recycle's spill
prices traffic with: the planner's per-layer seconds for the chosen type (`layer_costs`) and the type's
network bandwidth (`link_gbps`), `runtime.strategies.links.stated_by_cost_models`. Its stages are cut
as the planner cut them, and the runtime's plan path places lost hops with link costs, not compute only."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

import runtime.strategies.recycle as recycle_module
from controlplane.jobs.services import job_submit
from controlplane.market.models import SpotPool, SpotPrice
from controlplane.planning.services import _planner
from runtime.config import JobConfig
from runtime.distributed.membership import plan_for_fleet
from runtime.parallel.layout import pipelines_layout
from runtime.parallel.throughput import CostModel
from runtime.planner.catalog import instance_types
from runtime.planner.search import default_microbatch_size
from runtime.strategies.base import full_slots
from runtime.strategies.links import link_costs
from runtime.strategies.recycle import RecycleStrategy
from tests.controlplane.factories import make_instance_type, make_team, make_zone

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 256, "n_head": 4, "seq_len": 128, "vocab_size": 1024},
          "global_batch": 32}
TYPE = "g5.xlarge"


@pytest.fixture
def planned() -> JobConfig:
    at = timezone.now() - timedelta(hours=1)
    itype, zone = make_instance_type(TYPE, on_demand="1.006"), make_zone("us-east-1a", "use1-az1")
    SpotPrice.objects.create(instance_type=itype, zone=zone, price=Decimal("0.30"), timestamp=at)
    SpotPool.objects.create(instance_type=itype, zone=zone, latest_timestamp=at, latest_price=Decimal("0.30"))
    job = job_submit(
        team=make_team(), user=None, name="planned", strategy="recycle", target_steps=20_000,
        config={**CONFIG, "link_gbps": 1.0},  # replaced: a planned job states what it was priced with
        deadline=timezone.now() + timedelta(hours=12),
        plan={"auto": True, "provider": "aws", "instance_types": [TYPE], "max_nodes": 8})
    assert job.plan["chosen_by"] == "planner" and job.plan["pools"][0]["instance_type"] == TYPE
    return JobConfig.from_dict(job.config)


def _priced_with(config: JobConfig) -> CostModel:
    return _planner().cost_model(config.model, TYPE, default_microbatch_size(config.global_batch))


def test_a_planned_jobs_config_states_the_planners_layer_seconds_and_the_types_bandwidth(planned):
    cost = _priced_with(planned)
    assert planned.device_time is None  # real instances: no emulated time to price traffic against
    assert planned.layer_costs == cost.layer_costs() and all(c > 0 for c in planned.layer_costs)
    assert planned.link_gbps == instance_types()[TYPE].network_gbps == cost.network.bandwidth_gbps
    # The stages the runtime cuts for any pipeline depth are the ones the planner priced.
    for pp in range(1, planned.model.num_layers + 1):
        layout = pipelines_layout(dataclasses.replace(planned, dp=1, pp=pp), [list(range(pp))])
        assert list(layout.stages) == [tuple(b) for b in cost.bounds(pp)]
    links = link_costs(planned)
    assert isinstance(links, CostModel)
    assert links.network.bandwidth_gbps == planned.link_gbps
    assert [f + i + w for f, i, w in links.fiw] == pytest.approx(planned.layer_costs)


def test_the_runtime_plan_path_prices_a_planned_jobs_lost_hops_with_its_links(planned, monkeypatch):
    # The planned layout scaled out to 2 x 3 (unit level: the stated figures are what matter).
    config = dataclasses.replace(planned, dp=2, pp=3, microbatches=4, global_batch=8 * planned.microbatch_size)
    config.validate()
    seen: list[object] = []

    def spy(c: JobConfig):  # type: ignore[no-untyped-def]
        seen.append(link_costs(c))
        return seen[-1]

    monkeypatch.setattr(recycle_module, "link_costs", spy)
    lost = 4  # stage 1 of pipeline 1
    answer = plan_for_fleet(config, full_slots(config), gone={lost}, noticed=set())
    assert seen and all(isinstance(c, CostModel) for c in seen), "spill scored on compute only"
    slots = [[None if n == lost else n for n in row] for row in full_slots(config)]
    assert answer.layout == RecycleStrategy(costs=link_costs(config)).layout_for(config, slots)
