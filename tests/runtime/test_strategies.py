"""Pure tests of the strategies' layouts, generation plans, checkpoint storage and trace parsing."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from runtime.checkpointing.checkpoints import KEEP, Checkpoints
from runtime.checkpointing.durability import (
    checkpoint_due,
    checkpoint_interval_steps,
    estimated_mtbf_s,
    next_durability,
)
from runtime.checkpointing.youngdaly import young_interval
from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.distributed.generation_plan import GenerationPlan
from runtime.distributed.membership import initial_plan, make_plan
from runtime.models.load import load_model
from runtime.models.model import build_layer
from runtime.parallel.schedule import action_duration, build_schedule, simulate, validate_schedule
from runtime.strategies import get_strategy, initial_layout
from runtime.strategies.base import full_slots
from runtime.strategies.oobleck import pipeline_templates
from runtime.train.launcher import faults_from_trace
from runtime.train.optim import LayerState

pytestmark = pytest.mark.timeout(30)


def config(**kw) -> JobConfig:
    base = dict(dp=2, pp=4, microbatches=4, global_batch=32, model=ModelSpec(n_layer=6))
    base.update(kw)
    return JobConfig(**base)


def lose(slots, *nodes):
    return [[None if n in nodes else n for n in row] for row in slots]


def test_recycle_reroutes_only_the_lost_hop() -> None:
    c = config(strategy="recycle", recycle_spill=False)
    layout = get_strategy("recycle").layout_for(c, lose(full_slots(c), 5))
    assert 5 not in layout.nodes()
    for m, route in enumerate(layout.routes):
        # pipeline 1's stage-1 hop moves to node 1, the other stage-1 node; everything else stays
        expected = [0, 1, 2, 3] if layout.pipeline_of[m] == 0 else [4, 1, 6, 7]
        assert [n for _, n in route] == expected
    assert [s for s, _ in layout.routes[5]] == [0, 1, 2, 3]  # stages (and so the math) unchanged
    validate_schedule(layout, build_schedule(layout, "fiw"), "fiw")


def simulated_step(layout) -> float:
    timeline = simulate(build_schedule(layout, "fiw"), action_duration(layout))
    return max(end for row in timeline.values() for _, end, _ in row)


BENCH_GPT = ModelSpec(kind="gpt", n_layer=6, n_embd=32, n_head=2, seq_len=16, vocab_size=64)  # 2 layers a stage


def test_recycle_spill_shortens_the_degraded_step_with_the_same_stages() -> None:
    c = config(strategy="recycle", schedule="fiw", model=BENCH_GPT, recycle_spill=True)
    recycle = get_strategy("recycle")
    full = recycle.layout_for(c, full_slots(c))
    peers_only = recycle.layout_for(
        config(strategy="recycle", schedule="fiw", model=BENCH_GPT, recycle_spill=False), lose(full_slots(c), 5)
    )
    spilled = recycle.layout_for(c, lose(full_slots(c), 5))
    assert spilled == recycle.layout_for(c, lose(full_slots(c), 5))  # a pure function
    assert 5 not in spilled.nodes() and spilled.stages == full.stages
    for route, before in zip(spilled.routes, full.routes, strict=True):
        assert [s for s, _ in route] == [0, 1, 2, 3]  # same stages, so the same math
        moved = [h for h in range(4) if route[h] != before[h]]
        assert moved in ([], [1]) and (not moved or before[1][1] == 5)  # only the lost hop moves
    hosts = {route[1][1] for route in spilled.routes[4:]}
    assert len(hosts) > 1  # the lost node's work is spread, not all on node 1
    validate_schedule(spilled, build_schedule(spilled, "fiw"), "fiw")
    # unit costs: failure-free 30, peers-only 50 (node 1 computes 2 x 4 micro-batches of stage 1);
    # the schedule-search placement (before the scalable planner) reached 34, this one reaches 36.
    assert simulated_step(full) == 30 and simulated_step(peers_only) == 50
    assert simulated_step(spilled) <= 36


def test_recycle_spill_plan_copies_the_lost_stage_to_its_new_hosts() -> None:
    c = config(strategy="recycle", schedule="fiw", model=BENCH_GPT, recycle_spill=True)
    first = initial_plan(c)
    layout = first.layout
    alive = {n: record(3, dict.fromkeys(layout.layers_of(n), 3)) for n in range(8) if n != 5}
    plan = make_plan(c, generation=1, previous=first, alive=alive, joiners=[], checkpoint_step=None, reason="x")
    spilled = plan.layout
    new_hosts = {n for _, n in (r[1] for r in spilled.routes)} - {1}
    assert new_hosts
    assert sorted((dst, layer) for layer, _, dst in plan.transfers) == sorted(
        (n, layer) for n in new_hosts for layer in (2, 3)
    )
    assert all(src == 1 for _, src, _ in plan.transfers)  # node 1 is the only holder of stage 1 left


def test_recycle_without_any_node_of_a_stage_names_the_stage() -> None:
    c = config(strategy="recycle", recycle_spill=False)  # as published: only same-stage peers may host
    with pytest.raises(LayoutError, match="no surviving node for stage 1"):
        get_strategy("recycle").layout_for(c, lose(full_slots(c), 1, 5))


def test_recycle_spill_hosts_a_stage_with_no_slot_holder_left_on_other_survivors() -> None:
    # Whether any survivor still holds the stage's layers is the plan's question (next test).
    c = config(strategy="recycle", schedule="fiw")
    layout = get_strategy("recycle").layout_for(c, lose(full_slots(c), 1, 5))
    hosts = {route[1][1] for route in layout.routes}
    assert hosts and not hosts & {1, 5} and layout.stages == initial_layout(c).stages
    validate_schedule(layout, build_schedule(layout, "fiw"), "fiw")


def test_bamboo_predecessor_takes_over_and_replicas_follow_successors() -> None:
    c = config(strategy="bamboo")
    full = get_strategy("bamboo").layout_for(c, full_slots(c))
    assert (2, 1) in full.replicas and (0, 3) in full.replicas  # node 1 holds stage 2, node 3 wraps to 0
    taken = get_strategy("bamboo").layout_for(c, lose(full_slots(c), 5))
    assert taken.routes[4] == ((0, 4), (1, 4), (2, 6), (3, 7))  # node 4 runs stage 1 too
    lost_first = get_strategy("bamboo").layout_for(c, lose(full_slots(c), 4))
    assert lost_first.routes[4] == ((0, 7), (1, 5), (2, 6), (3, 7))  # ring predecessor of stage 0
    for layout in (full, taken, lost_first):
        validate_schedule(layout, build_schedule(layout), "1f1b")


def test_oobleck_templates_cover_every_count_and_reject_others() -> None:
    c = config(strategy="oobleck", min_stages=2)
    templates = pipeline_templates(c)
    assert templates[8] == [4, 4] and templates[7] == [4, 3] and templates[5] == [3, 2]
    assert 1 not in templates and 3 in templates
    layout = get_strategy("oobleck").layout_for(c, lose(full_slots(c), 5))
    assert [len(set(n for _, n in r)) for r in layout.routes].count(4) == 5  # 5 of 8 micro-batches on 4 nodes
    with pytest.raises(LayoutError, match=r"1 nodes: no pipeline template covers this count; templates cover 2\.\.8"):
        get_strategy("oobleck").layout_for(c, [[0, None, None, None], [None] * 4])


def test_checkpoint_regroups_full_pipelines_and_young_daly() -> None:
    c = config(strategy="checkpoint")
    layout = get_strategy("checkpoint").layout_for(c, lose(full_slots(c), 5))
    assert layout.pipelines() == {0: (0, 1, 2, 3)} and layout.standby == (4, 6, 7)
    assert layout.num_microbatches == 8  # the one pipeline takes the whole global batch
    assert young_interval(checkpoint_cost_s=0.5, mtbf_s=3600) == pytest.approx(60.0)
    assert checkpoint_interval_steps(config(mtbf_s=3600, checkpoint_cost_s=0.5, step_time_s=2.0)) == 30
    assert checkpoint_interval_steps(config(checkpoint_interval=7)) == 7


@pytest.mark.parametrize(("field", "value"), [
    ("mtbf_s", 0.0), ("mtbf_s", -5.0), ("mtbf_s", float("nan")), ("mtbf_s", float("inf")),
    ("checkpoint_cost_s", -0.1), ("checkpoint_cost_s", float("nan")), ("step_time_s", 0.0),
    ("step_time_s", float("inf")), ("checkpoint_interval", -1),
])
def test_checkpoint_priors_that_would_break_young_daly_are_refused_naming_the_field(field, value) -> None:
    """A prior the interval formula cannot use (a square root of a negative, a NaN round) is the
    contract's 400 at submit, not an error in the trainer at its first checkpoint decision."""
    with pytest.raises(LayoutError, match=f"{field}=") as raised:
        config(**{field: value}).validate()
    assert raised.value.field == field


def test_interval_follows_the_observed_failure_rate_and_the_measured_write() -> None:
    # MTBF: the prior counts as one pseudo-failure interval; never above the prior.
    assert estimated_mtbf_s(3600, elapsed_s=0, failures=0) == 3600
    assert estimated_mtbf_s(3600, elapsed_s=10_000, failures=0) == 3600  # quiet time does not raise it
    assert estimated_mtbf_s(3600, elapsed_s=400, failures=1) == 2000  # (3600 + 400) / 2
    assert estimated_mtbf_s(3600, elapsed_s=400, failures=3) == 1000  # (3600 + 400) / 4
    c = config(mtbf_s=3600, checkpoint_cost_s=0.5, step_time_s=2.0)
    assert checkpoint_interval_steps(c) == 30  # priors: sqrt(2 * 0.5 * 3600) = 60 s = 30 steps
    previous = {"started_at": 1000.0, "failures": 1}  # the previous plan's durability fields
    records = {0: {"checkpoint_cost_s": 0.02, "step_time_s": 1.0}, 2: {"checkpoint_cost_s": 0.08, "step_time_s": 0.5}}
    fields = next_durability(c, **previous, lost=True, records=records, now=1400.0)
    # 2 failures in 400 s: MTBF (3600 + 400) / 3; the slowest writer (0.08 s) and step (1.0 s)
    assert fields["failures"] == 2 and fields["started_at"] == 1000.0
    assert fields["mtbf_s"] == pytest.approx(4000 / 3)
    assert fields["checkpoint_every"] == round(young_interval(checkpoint_cost_s=0.08, mtbf_s=4000 / 3) / 1.0) == 15
    # Nothing measured yet: the priors; a notice (lost=False) is not a failure.
    assert next_durability(c, **previous, lost=False, records={0: {}}, now=1000.0)["checkpoint_every"] == round(
        young_interval(checkpoint_cost_s=0.5, mtbf_s=3600 / 2) / 2.0)
    assert next_durability(config(checkpoint_interval=3), **previous, lost=True, records=records,
                           now=1400.0)["checkpoint_every"] == 3  # the configured interval overrides
    # Due every `checkpoint_every` steps from the generation's start, never at the last step.
    assert [t for t in range(12) if checkpoint_due(t, 9, every=2, start_step=3)] == [5, 7]


def test_plans_carry_the_interval_every_rank_checkpoints_at() -> None:
    c = config(strategy="recycle", recycle_spill=False, dp=2, pp=2, microbatches=2, global_batch=8,
               model=ModelSpec(n_layer=2), mtbf_s=100.0, checkpoint_cost_s=0.5, step_time_s=1.0)
    first = initial_plan(c, started_at=50.0)
    assert first.checkpoint_every == 10 and first.failures == 0  # sqrt(2 * 0.5 * 100) s of 1 s steps
    alive = {n: {**record(2, {}), "checkpoint_cost_s": 0.5, "step_time_s": 1.0} for n in (0, 2, 3)}
    plan = make_plan(c, generation=1, previous=first, alive=alive, joiners=[], checkpoint_step=None,
                     reason="x", now=150.0)
    # Recycle survived losing node 1 on its peers: no checkpoint was needed, so it is not a failure
    # of the kind checkpoints guard against (at fleet size such losses come every few seconds).
    assert plan.failures == 0 and plan.checkpoint_every == 10
    restarts = config(strategy="checkpoint", dp=2, pp=2, microbatches=2, global_batch=8, model=ModelSpec(n_layer=2),
                      mtbf_s=100.0, checkpoint_cost_s=0.5, step_time_s=1.0)
    plan = make_plan(restarts, generation=1, previous=initial_plan(restarts, started_at=50.0), alive=alive,
                     joiners=[], checkpoint_step=None, reason="x", now=150.0)
    assert plan.failures == 1  # checkpoint-restart restarts from its checkpoint on every loss


def test_losing_every_holder_of_a_stage_restarts_from_the_checkpoint() -> None:
    c = config(strategy="recycle", dp=2, pp=2, microbatches=2, global_batch=8, model=ModelSpec(n_layer=2))
    first = initial_plan(c)
    alive = {n: record(5, dict.fromkeys(range(*first_layout_range(first, n)), 5)) for n in (0, 2)}

    def lose_stage_1(step: int | None) -> GenerationPlan:
        return make_plan(c, generation=1, previous=first, alive=alive, joiners=[], checkpoint_step=step,
                         reason="failure")

    plan = lose_stage_1(4)
    assert plan.restore_step == plan.start_step == 4 and not plan.transfers
    assert plan.slots == [[0, 2], [None, None]]  # the survivors packed into fresh slots
    assert sorted(plan.members) == [0, 2] and plan.lost == [1, 3]
    assert plan.reason.endswith("restored from checkpoint step 4")
    missing = lose_stage_1(None).error
    assert "no surviving copy" in missing and missing.endswith("no checkpoint was available to restart from")
    # `none` never restarts, checkpoint or not.
    assert make_plan(dataclasses.replace(c, strategy="none"), generation=1, previous=first,
                     alive=alive, joiners=[], checkpoint_step=4, reason="failure").error is not None


def record(committed: int, layers: dict[int, int], leaving: bool = False) -> dict:
    return {"committed": committed, "versions": {str(k): v for k, v in layers.items()}, "leaving": leaving}


def test_plan_moves_missing_layers_from_surviving_replicas() -> None:
    c = config(strategy="oobleck", dp=2, pp=2, microbatches=2, global_batch=8, model=ModelSpec(n_layer=2))
    first = initial_plan(c)
    stage = {n: set(range(*first_layout_range(first, n))) for n in first.members}
    alive = {n: record(3, dict.fromkeys(stage[n], 3)) for n in (0, 2, 3)}
    plan = make_plan(c, generation=1, previous=first, alive=alive, joiners=[], checkpoint_step=None, reason="x")
    assert plan.start_step == 3 and plan.lost == [1]
    assert plan.transfers and all(src != 1 for _, src, _ in plan.transfers)


def first_layout_range(plan: GenerationPlan, node: int) -> tuple[int, int]:
    layout = plan.layout
    stage = next(s for r in layout.routes for s, n in r if n == node)
    return tuple(layout.stages[stage])  # type: ignore[return-value]


def test_plan_error_when_no_copy_survives() -> None:
    c = config(strategy="recycle", dp=1, pp=2, microbatches=2, global_batch=4, model=ModelSpec(n_layer=2))

    def plan_without_node_1(cfg: JobConfig) -> GenerationPlan:
        return make_plan(cfg, generation=1, previous=initial_plan(cfg), alive={0: record(2, {0: 2, 1: 2})},
                         joiners=[], checkpoint_step=None, reason="x")

    # With spill (the default) node 0 could host stage 1, but nobody holds its layer any more.
    assert plan_without_node_1(c).error == (
        "layer 2 has no surviving copy at step 2 (every node that held it is gone; no replica had it); "
        "no checkpoint was available to restart from"
    )
    peers_only = plan_without_node_1(dataclasses.replace(c, recycle_spill=False))
    assert "no surviving node for stage 1" in peers_only.error


def state(index: int) -> LayerState:
    s = LayerState(index, build_layer(ModelSpec(), index, 0))
    s.version = 5
    return s


def test_checkpoints_are_exports_complete_when_the_last_writer_is_done_and_keep_two(tmp_path) -> None:
    spec = ModelSpec()
    states = {i: state(i) for i in range(spec.num_layers)}
    half = spec.num_layers // 2
    writers = {i: 0 if i < half else 1 for i in states}
    store = Checkpoints(str(tmp_path))

    def write(step: int, node: int) -> bool:
        mine = {i: s for i, s in states.items() if writers[i] == node}
        return store.write(step, spec=spec, layers={i: s.module for i, s in states.items()}, writers=writers,
                           node=node, states=mine, export_id=f"j/{step}", info={})

    assert not write(2, 1) and store.latest() is None  # one writer of two: not complete
    assert write(2, 0) and store.latest() == 2
    back = LayerState(1, build_layer(spec, 1, 99))
    store.load(2, back)
    assert back.version == 5
    for a, b in zip(back.tensors(), states[1].tensors(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    whole = load_model(store.step_dir(2))  # a checkpoint is a weights folder: load_model reads it
    torch.testing.assert_close(whole[1].state_dict(), states[1].module.state_dict(), rtol=0, atol=0)
    for step in (4, 6):
        write(step, 1)
        write(step, 0)
    assert store.complete_steps() == [4, 6] and KEEP == 2  # step 2 was deleted
    assert not (tmp_path / "checkpoints" / "step-2").exists()
    for step in (8, 10, 12):  # never completed (the other writer died): only the 2 newest stay
        write(step, 0)  # layer 0's writer prunes even when nothing completes (one pruner, not every writer)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-10", "step-12", "step-4", "step-6"]
    assert store.latest() == 6
    write(14, 1)  # any other writer of an incomplete checkpoint lists nothing and deletes nothing
    assert len(list((tmp_path / "checkpoints").iterdir())) == 5


def test_listing_checkpoints_survives_a_folder_pruned_meanwhile(tmp_path, monkeypatch) -> None:
    # Two writers prune (the one that completed a checkpoint, layer 0's): one may delete a step's
    # folder while the other lists it. The listing skips it (a glob over both levels raised
    # FileNotFoundError there and killed the worker, seen in tests/runtime/test_join_batching.py).
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step}" / "model.safetensors").write_bytes(b"")
    listdir = os.listdir

    def pruned_meanwhile(path):
        if Path(path).name == "step-2":
            raise FileNotFoundError(path)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", pruned_meanwhile)
    assert Checkpoints(str(tmp_path)).complete_steps() == [4]


def test_snapshot_rollback_restores_the_pre_step_state() -> None:
    s = state(2)
    before = [t.clone() for t in s.tensors()]
    s.step([torch.ones_like(p) for p in s.params], lr=0.1, weight_decay=0.0, snapshot=True)
    assert s.version == 6
    s.rollback_to(5)
    for a, b in zip(s.tensors(), before, strict=True):
        torch.testing.assert_close(a, b)


def test_trace_becomes_timed_kills_and_joins(shared_data) -> None:
    faults, joins = faults_from_trace(shared_data / "traces" / "aws-p3.2xlarge-bamboo.csv", nodes=8, time_scale=1e-3)
    assert faults and all(f.kind == "kill" and f.node >= 0 for f in faults)
    assert faults[0].time_s == 0.0
    assert all(j.node >= 8 for j in joins)
    times = [f.time_s for f in faults]
    assert times == sorted(times)
