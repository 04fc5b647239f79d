"""The plan search: feasibility errors name the field and carry the nearest plan; templates; the
pick is within 5% of the exhaustive optimum."""

from __future__ import annotations

import itertools

import pytest

from runtime.config import ModelSpec
from runtime.planner.catalog import bucket_rate_per_hour, instance_types, load_spot_advisor
from runtime.planner.search import PlanError, Planner, PlanRequest, Pool, goodput_fraction

SPEC = ModelSpec(kind="gpt", n_layer=6, n_embd=256, n_head=4, seq_len=128, vocab_size=1024)
POOLS = [
    Pool(instance_type="g4dn.xlarge", spot_usd_per_hour=0.2, preemptions_per_node_hour=0.1, max_nodes=16),
    Pool(instance_type="g5.xlarge", spot_usd_per_hour=0.4, preemptions_per_node_hour=0.2, max_nodes=16),
]


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def request(**kw) -> PlanRequest:
    fields = {"model": SPEC, "global_batch": 64, "samples": 20_000_000, "pools": POOLS}
    fields.update(kw)
    return PlanRequest(**fields)


def test_plan_meets_the_deadline_and_lists_alternatives(planner):
    plan = planner.plan(request(deadline_hours=24))
    assert plan.best.feasible and plan.best.hours <= 24
    assert plan.best.model == "replay"
    assert plan.considered >= 50
    assert plan.alternatives[0] is plan.best
    costs = [c.cost_usd for c in plan.alternatives[1:] if c.feasible]
    assert costs == sorted(costs)
    assert {"hours", "cost_usd", "expected_preemptions", "risk_source"} <= set(plan.best.to_dict())


def test_pick_within_five_percent_of_exhaustive(planner):
    for limits in ({"deadline_hours": 10}, {"budget_usd": 20.0}, {"deadline_hours": 30, "budget_usd": 40.0}):
        req = request(**limits)
        pick = planner.plan(req).best
        best = planner.plan(req, exhaustive=True).best
        key = "hours" if "deadline_hours" not in limits else "cost_usd"
        assert getattr(pick, key) <= getattr(best, key) * 1.05


def test_deadline_that_cannot_be_met_names_the_field_and_the_nearest(planner):
    with pytest.raises(PlanError) as info:
        planner.plan(request(deadline_hours=0.01))
    err = info.value
    assert err.field == "deadline_hours"
    assert "cannot be met" in err.message
    assert err.nearest is not None and err.nearest.hours > 0.01
    fastest = planner.plan(request(), exhaustive=True).alternatives
    assert err.nearest.hours <= min(c.hours for c in fastest) * 1.05


def test_budget_too_small(planner):
    with pytest.raises(PlanError) as info:
        planner.plan(request(budget_usd=0.01))
    assert info.value.field == "budget_usd"
    assert info.value.nearest is not None and info.value.nearest.cost_usd > 0.01


def test_model_that_fits_no_allowed_type(planner):
    huge = ModelSpec(kind="gpt", n_layer=4, n_embd=8192, n_head=8, seq_len=2048, vocab_size=50_000)
    small = [Pool(instance_type="g4dn.xlarge", spot_usd_per_hour=0.2, max_nodes=2)]
    with pytest.raises(PlanError) as info:
        planner.plan(request(model=huge, pools=small, global_batch=8))
    assert info.value.field == "pools"
    assert "fits no allowed instance type" in info.value.message
    assert "GiB" in info.value.message


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"global_batch": 0}, "global_batch"),
        ({"samples": 0}, "samples"),
        ({"pools": []}, "pools"),
        ({"deadline_hours": -1}, "deadline_hours"),
        ({"microbatch_size": 3}, "microbatch_size"),
    ],
)
def test_bad_input_names_the_field(planner, kw, field):
    with pytest.raises(PlanError) as info:
        planner.plan(request(**kw))
    assert info.value.field == field


def test_templates_cover_every_node_count_from_the_smallest_fit(planner):
    plan = planner.plan(request(deadline_hours=24))
    counts = [t["nodes"] for t in plan.templates]
    assert counts[-1] == plan.best.nodes
    # Every count the job could shrink to, from the first that fits, has a template.
    assert counts == list(range(counts[0], plan.best.nodes + 1))
    for t in plan.templates:
        sizes = [p["nodes"] for p in t["pipelines"]]
        assert sum(sizes) == t["nodes"] and max(sizes) - min(sizes) <= 1
        assert sum(p["microbatches"] for p in t["pipelines"]) == 64 // 8  # the global batch never changes
        for p in t["pipelines"]:
            stages = p["stages"]
            assert len(stages) == p["nodes"]
            assert stages[0][0] == 0 and stages[-1][1] == SPEC.num_layers
            assert all(a[1] == b[0] for a, b in itertools.pairwise(stages))


def test_templates_start_at_the_fewest_nodes_that_fit_in_memory(planner):
    big = ModelSpec(kind="gpt", n_layer=24, n_embd=1024, n_head=16, seq_len=512, vocab_size=8192)
    pools = [Pool(instance_type="g4dn.xlarge", spot_usd_per_hour=0.2, preemptions_per_node_hour=0.1, max_nodes=16)]
    plan = planner.plan(request(model=big, pools=pools, global_batch=128, samples=1_000_000))
    first = plan.templates[0]
    assert first["nodes"] > 1  # 16 GiB cannot hold this model on one node
    assert [t["nodes"] for t in plan.templates] == list(range(first["nodes"], plan.best.nodes + 1))


def test_goodput_falls_with_rate_and_checkpoint_pays_more():
    kw = {"nodes": 32, "step_s": 1.0}
    assert goodput_fraction(strategy="recycle", rate_per_node_hour=0.0, **kw) == 1.0
    low = goodput_fraction(strategy="recycle", rate_per_node_hour=0.1, **kw)
    high = goodput_fraction(strategy="recycle", rate_per_node_hour=0.6, **kw)
    assert 1.0 > low > high
    assert goodput_fraction(strategy="checkpoint", rate_per_node_hour=0.6, **kw) < high


def test_shipped_catalog_and_advisor_buckets(shared_data):
    types = instance_types()
    assert len(types) >= 24 and types["p3.2xlarge"].accelerator == "V100"
    rates = [bucket_rate_per_hour(b) for b in range(5)]
    assert rates == sorted(rates) and rates[0] > 0
    snapshot = load_spot_advisor(shared_data / "spot-advisor" / "spot-advisor-data-2025-07.json.gz")
    assert len(snapshot) > 300
    shipped = {n: t.advisor_bucket for n, t in types.items() if t.advisor_bucket is not None}
    assert all(snapshot[n] == b for n, b in shipped.items() if n in snapshot)


def test_stored_measured_profiles_win_and_train_the_predictor(tmp_path):
    from runtime.planner.predictor import DEFAULT_COEFFICIENTS
    from runtime.planner.profile import DeviceSpec, ProfileStore, profile_model

    tiny = ModelSpec(kind="mlp", n_layer=2, n_embd=16, in_features=8, vocab_size=4)
    store = ProfileStore(tmp_path)
    measured = profile_model(
        tiny, microbatch_size=8, repeats=2, instance_type="g4dn.xlarge", device=DeviceSpec("cpu", 0.1, 10.0)
    )
    store.save(measured)
    planner = Planner(store=store)
    assert planner.profile_for(tiny, "g4dn.xlarge", 8).fiw() == measured.fiw()
    predicted = planner.profile_for(tiny, "g5.xlarge", 8)
    assert predicted.measured is False
    assert planner.predictor.coefficients != DEFAULT_COEFFICIENTS
