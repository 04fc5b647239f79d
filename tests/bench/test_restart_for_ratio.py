"""`bench.simulate.restart_for_ratio`: the checkpoint-restart restart time a bamboo ratio implies."""

from __future__ import annotations

from bench.simulate import RESTART_SEARCH_MAX_S, checkpoint_rate_with_restart, restart_for_ratio
from runtime.config import ModelSpec
from runtime.parallel.throughput import CostModel
from runtime.sim.engine import SimParams, simulate
from runtime.sim.iteration import IterationModel
from runtime.sim.synthetic import synthetic_trace

SPEC = ModelSpec(kind="mlp", n_layer=2, n_embd=8)  # 4 layers


def _job() -> tuple:
    layers = SPEC.num_layers
    cost = CostModel(fiw=[(0.01, 0.01, 0.01)] * layers, output_bytes=[0.0] * layers, param_bytes=[0.0] * layers)
    model = IterationModel(spec=SPEC, dp=2, pp=2, microbatches=4, cost=cost)
    trace = synthetic_trace(nodes=4, hours=6.0, rate_per_node_hour=0.5, mean_burst=1.5,
                            replacement_delay_s=300, seed=4)
    params = SimParams(checkpoint_cost_s=2.0)
    bamboo = simulate(trace, strategy="bamboo", model=model, params=params, samples_per_microbatch=4)
    return model, trace, params, bamboo.samples_per_s


def _ratio(model, trace, params, bamboo_rate: float, restart_s: float) -> float:
    return bamboo_rate / checkpoint_rate_with_restart(trace, model, params, restart_s)


def test_the_restart_found_is_the_shortest_that_reaches_the_ratio():
    model, trace, params, bamboo_rate = _job()
    at_model = _ratio(model, trace, params, bamboo_rate, params.restart_total_s)
    target = at_model * 1.5  # above what the model's own restart gives, so a longer restart is needed
    found = restart_for_ratio(trace, model, params, bamboo_rate, target)
    assert found is not None and params.restart_total_s < found < RESTART_SEARCH_MAX_S
    assert _ratio(model, trace, params, bamboo_rate, found) >= target
    # To the 1 s tolerance (and 0.05 s of rounding): a second shorter does not reach it.
    assert _ratio(model, trace, params, bamboo_rate, found - 1.05) < target


def test_a_ratio_already_reached_is_the_models_restart_and_an_unreachable_one_is_none():
    model, trace, params, bamboo_rate = _job()
    at_model = _ratio(model, trace, params, bamboo_rate, params.restart_total_s)
    assert restart_for_ratio(trace, model, params, bamboo_rate, at_model * 0.5) == round(params.restart_total_s, 1)
    assert restart_for_ratio(trace, model, params, bamboo_rate, 1e9) is None
