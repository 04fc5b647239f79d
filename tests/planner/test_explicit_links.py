"""A job with an explicit plan on cataloged instance types states what the planner would price those
types with (`layer_costs`, `link_gbps`; `runtime.strategies.links.stated_by_cost_models`), so recycle's
spill prices a new host's traffic, unless the user states a time scale (`device_time`, `layer_costs`)
or `link_gbps` of their own. Local plans and user models keep their config as given."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.jobs.services import job_submit
from controlplane.planning.services import _planner
from runtime.config import JobConfig
from runtime.parallel.throughput import CostModel
from runtime.planner.catalog import instance_types
from runtime.strategies.links import link_costs
from tests.controlplane.factories import make_team

pytestmark = pytest.mark.django_db

CONFIG = {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 256, "n_head": 4, "seq_len": 128, "vocab_size": 1024},
          "global_batch": 32}
TYPES = ["g5.xlarge", "g4dn.xlarge"]
LAYOUT = {"dp": 2, "pp": 2, "microbatches": 4}


def _submitted(config: dict, plan: dict) -> tuple[JobConfig, dict]:
    job = job_submit(team=make_team(), user=None, name="explicit", strategy="recycle", target_steps=100,
                     config=config, deadline=timezone.now() + timedelta(hours=12), plan=plan)
    assert job.plan["chosen_by"] == "user"
    return JobConfig.from_dict(job.config), job.config


def test_an_explicit_plan_on_cataloged_types_states_their_slowest_layer_seconds_and_bandwidth():
    config, _ = _submitted(CONFIG, {**LAYOUT, "provider": "aws", "instance_types": TYPES})
    costs = [_planner().cost_model(config.model, t, config.microbatch_size) for t in TYPES]
    assert config.device_time is None
    assert config.layer_costs == [max(c.compute_scale * c.layer_costs()[i] for c in costs)
                                  for i in range(config.model.num_layers)]
    assert all(c > 0 for c in config.layer_costs)
    assert config.link_gbps == min(instance_types()[t].network_gbps for t in TYPES)
    assert isinstance(link_costs(config), CostModel)


def test_the_users_own_figures_win():
    own = [0.01 * (i + 1) for i in range(JobConfig.from_dict(CONFIG).model.num_layers)]
    config, _ = _submitted({**CONFIG, "layer_costs": own}, {**LAYOUT, "provider": "aws", "instance_types": TYPES})
    assert config.layer_costs == own and config.link_gbps == JobConfig().link_gbps
    device_time = {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}
    config, _ = _submitted({**CONFIG, "device_time": device_time},
                           {**LAYOUT, "provider": "aws", "instance_types": TYPES})
    assert not config.layer_costs and config.link_gbps == JobConfig().link_gbps
    config, _ = _submitted({**CONFIG, "link_gbps": 0.0}, {**LAYOUT, "provider": "aws", "instance_types": TYPES})
    assert config.layer_costs and config.link_gbps == 0.0 and link_costs(config) is None  # 0: compute only


@pytest.mark.parametrize("extra", [{}, {"device_time": {"forward_ms": 4, "backward_input_ms": 4,
                                                         "backward_weight_ms": 4}}])
def test_a_local_explicit_plan_keeps_its_config_as_given(extra):
    config, stored = _submitted({**CONFIG, **extra}, {**LAYOUT, "provider": "local"})
    assert not config.layer_costs and config.link_gbps == JobConfig().link_gbps
    assert stored["device_time"] == extra.get("device_time")


def test_a_user_models_explicit_plan_keeps_its_config_as_given():
    # The control plane never imports user code, so it has no per-layer seconds to state.
    user = {"model": {"kind": "py", "path": "mypkg.model:build", "layers": 4}, "global_batch": 32}
    config, _ = _submitted(user, {**LAYOUT, "provider": "aws", "instance_types": TYPES})
    assert not config.layer_costs and config.link_gbps == JobConfig().link_gbps and link_costs(config) is None
