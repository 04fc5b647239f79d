"""The throughput model: replays of the runtime's schedule with profiled durations."""

from __future__ import annotations

import pytest

from runtime.config import ModelSpec
from runtime.parallel.throughput import CostModel, Network, allreduce_time

SPEC = ModelSpec(kind="mlp", n_layer=6, n_embd=8)  # 8 layers


def cost(**kw) -> CostModel:
    n = SPEC.num_layers
    kw.setdefault("network", Network(latency_s=0.0))
    return CostModel(fiw=[(1.0, 1.0, 1.0)] * n, output_bytes=[0.0] * n, param_bytes=[0.0] * n, **kw)


def test_one_stage_is_sum_of_compute():
    c = cost()
    assert c.pipeline_step_time(SPEC, pp=1, microbatches=4) == pytest.approx(4 * 8 * 3.0)


def test_1f1b_matches_textbook_bubble_for_uniform_stages():
    c = cost()
    for pp, m in ((2, 4), (4, 8)):
        per_stage = 8 / pp * 3.0
        assert c.pipeline_step_time(SPEC, pp=pp, microbatches=m) == pytest.approx((m + pp - 1) * per_stage)


def test_extrapolation_for_many_microbatches_matches_the_replay():
    c = cost()
    extrapolated = c.pipeline_step_time(SPEC, pp=4, microbatches=40)
    exact = c.step_time(c.pipeline_layout(SPEC, pp=4, microbatches=40))
    assert extrapolated == pytest.approx(exact, rel=0.01)


def test_closed_form_close_to_replay():
    c = cost(network=Network(bandwidth_gbps=10, latency_s=1e-3))
    for pp, m, sched in ((2, 8, "1f1b"), (4, 8, "fiw"), (8, 16, "1f1b")):
        replay = c.pipeline_step_time(SPEC, pp=pp, microbatches=m, schedule=sched)
        assert c.analytic_step_time(pp=pp, microbatches=m, schedule=sched) == pytest.approx(replay, rel=0.15)


def test_communication_and_allreduce_add_time():
    n = SPEC.num_layers
    base = cost().pipeline_step_time(SPEC, pp=2, microbatches=4, dp=4)
    slow = CostModel(
        fiw=[(1.0, 1.0, 1.0)] * n,
        output_bytes=[1e9] * n,
        param_bytes=[1e9] * n,
        network=Network(bandwidth_gbps=8.0),
    )
    assert slow.pipeline_step_time(SPEC, pp=2, microbatches=4, dp=4) > base
    assert allreduce_time(1e9, 4, Network(bandwidth_gbps=8.0)) == pytest.approx(2 * 3 / 4 * 1.0 + 6 * 50e-6)
    assert allreduce_time(1e9, 1, Network()) == 0.0
