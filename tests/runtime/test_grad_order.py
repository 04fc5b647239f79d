"""The fixed gradient summation order: whatever node computes which micro-batch, and in whatever
order its schedule runs them, every layer's gradient has the same bits."""

from __future__ import annotations

import random

import pytest
import torch

from runtime.distributed.grad_order import (
    GradAccumulator,
    RunSum,
    chunk_windows,
    contribution_numel,
    fold,
    grad_plan,
    home_pipelines,
    runs_in_order,
)
from runtime.parallel.layout import Layout
from runtime.strategies import get_strategy, initial_layout
from tests.runtime.conftest import small_config

LAYER_SHAPES = {0: [(3, 2), (3,)], 1: [(2, 2)], 2: [(2,)], 3: [(2, 3), (2,)]}
"""Per layer of the small model (2 blocks + embedding + head), tiny parameters: easy to read."""


def _grads(num_mb: int, seed: int) -> dict[tuple[int, int], list[torch.Tensor]]:
    """(layer, micro-batch) -> per-parameter gradients, with magnitudes far apart so that any other
    summation order changes the low bits."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for layer, shapes in LAYER_SHAPES.items():
        for m in range(num_mb):
            out[(layer, m)] = [torch.randn(s, generator=gen) * 10.0 ** (m % 4 - 2) for s in shapes]
    return out


def _canonical(grads, home: tuple[int, ...], layer: int) -> torch.Tensor:
    """The documented expression: per home pipeline, micro-batches in order; pipelines in order."""
    total = None
    for g in sorted(set(home)):
        chain = None
        for m in (m for m in range(len(home)) if home[m] == g):
            flat = torch.cat([t.reshape(-1) for t in grads[(layer, m)]])
            chain = flat.clone() if chain is None else chain.add_(flat)
        total = chain if total is None else total.add_(chain)
    return total


def _run(layout: Layout, home: tuple[int, ...], grads, shuffle: random.Random) -> dict[int, torch.Tensor]:
    """Every node accumulates its micro-batches (autograd-style, in a shuffled order) and the
    owners' contributions are folded; returns layer -> gradient."""
    plan = grad_plan(layout, home)
    numel = {layer: sum(torch.Size(s).numel() for s in shapes) for layer, shapes in LAYER_SHAPES.items()}
    parts: dict[int, torch.Tensor] = {}
    for node in layout.nodes():
        params = {layer: [torch.nn.Parameter(torch.zeros(s)) for s in shapes] for layer, shapes in LAYER_SHAPES.items()}
        acc = GradAccumulator(plan, node, params)
        work = [(layer, m) for m in range(len(home)) for layer in LAYER_SHAPES if plan.unit_of[(layer, m)] in
                plan.units(node, layer)]
        shuffle.shuffle(work)
        for layer, m in work:
            acc.begin(range(layer, layer + 1), m)
            for p, g in zip(params[layer], grads[(layer, m)], strict=True):
                p.grad = g.clone() if p.grad is None else p.grad.add_(g)  # what autograd does
            acc.end()
        contribution = acc.contribution(0, len(LAYER_SHAPES))
        assert contribution.numel() == contribution_numel(plan, node, 0, len(LAYER_SHAPES), numel)
        parts[node] = contribution
    flat = fold(plan, parts, 0, len(LAYER_SHAPES), numel)
    # The reduce-scatter's way: each chunk folded alone from the owners' pieces of it.
    run = RunSum(plan, 0, len(LAYER_SHAPES), numel)
    for owners in (2, 3, 5):
        chunks = [run.fold({n: run.piece(n, part, w) for n, part in parts.items()}, w)
                  for w in chunk_windows(run.numel, owners)]
        assert torch.equal(torch.cat(chunks), flat), f"{owners} chunks"
    assert layout.num_layers == len(LAYER_SHAPES)
    return dict(zip(LAYER_SHAPES, flat.split([numel[layer] for layer in LAYER_SHAPES]), strict=True))


def _config(**kw):
    from runtime.config import ModelSpec

    return small_config(model=ModelSpec(n_layer=2), **kw)


@pytest.mark.parametrize(
    ("dp", "pp", "microbatches", "slots"),
    [
        (2, 2, 3, None),  # failure-free
        (2, 2, 3, [[0, None], [2, 3]]),  # DP=2: the peer computes the lost pipeline's whole chain
        (3, 2, 2, [[0, None], [2, 3], [4, 5]]),  # DP=3 round-robin: the lost chain is split
        (3, 2, 2, [[None, 1], [2, None], [4, 5]]),  # two pipelines hit, at different stages
    ],
)
def test_any_routing_and_any_order_give_the_same_bits(dp, pp, microbatches, slots) -> None:
    config = _config(strategy="recycle", dp=dp, pp=pp, microbatches=microbatches, global_batch=4 * dp * microbatches)
    home = home_pipelines(config)
    layout = initial_layout(config) if slots is None else get_strategy("recycle").layout_for(config, slots)
    grads = _grads(len(home), seed=dp * 10 + pp)
    for trial in range(5):
        out = _run(layout, home, grads, random.Random(trial))
        for layer in LAYER_SHAPES:
            assert torch.equal(out[layer], _canonical(grads, home, layer)), (layer, trial)


def test_a_different_order_really_changes_the_bits() -> None:
    # Guards the test above: its gradients are such that the naive one-buffer sum differs.
    config = _config(strategy="recycle", dp=3, pp=2, microbatches=2, global_batch=24)
    home = home_pipelines(config)
    grads = _grads(len(home), seed=32)
    naive = None
    for m in range(len(home)):
        flat = torch.cat([t.reshape(-1) for t in grads[(0, m)]])
        naive = flat.clone() if naive is None else naive.add_(flat)
    assert not torch.equal(naive, _canonical(grads, home, 0))


def test_failure_free_nodes_send_one_unit_per_layer() -> None:
    config = _config(strategy="recycle", dp=2, pp=2, microbatches=3, global_batch=24)
    layout = initial_layout(config)
    plan = grad_plan(layout, home_pipelines(config))
    for node in layout.nodes():
        for layer in layout.layers_of(node):
            assert len(plan.units(node, layer)) == 1


def test_split_chain_sends_singles_and_the_prefix() -> None:
    # DP=3, node 1 (pipeline 0, stage 1) lost: its two micro-batches go round-robin to nodes 3 and 5
    # (peers only, so the placement does not depend on spill's tie order).
    config = _config(strategy="recycle", recycle_spill=False, dp=3, pp=2, microbatches=2, global_batch=24)
    layout = get_strategy("recycle").layout_for(config, [[0, None], [2, 3], [4, 5]])
    plan = grad_plan(layout, home_pipelines(config))
    assert layout.stages[1] == (3, 4)
    assert plan.units(3, 3) == ((0, 0), (1, 2))  # pipeline 0's prefix (mb 0) and its own chain
    assert plan.units(5, 3) == ((0, 1), (2, 4))  # a single (mb 1) and its own chain
    assert plan.members[(3, (0, 0))] == (0,) and plan.members[(3, (1, 2))] == (2, 3)


def test_home_pipelines_must_cover_the_layout() -> None:
    config = _config(strategy="recycle")
    with pytest.raises(ValueError, match="home pipelines cover 1 micro-batches; expected 4"):
        grad_plan(initial_layout(config), (0,))


def test_runs_in_order_only_when_autograd_alone_gives_the_unit() -> None:
    # Then the executor leaves `.grad` to autograd (no per-backward work); anything else takes the
    # general path. The bit-for-bit tests in test_failures.py cover both paths end to end.
    config = _config(strategy="recycle", dp=2, pp=2, microbatches=3, global_batch=24)
    layout = initial_layout(config)
    plan = grad_plan(layout, home_pipelines(config))
    stage1 = range(*layout.stages[1])
    assert runs_in_order(plan, 1, [(stage1, m) for m in (0, 1, 2)])
    assert not runs_in_order(plan, 1, [(stage1, m) for m in (0, 2, 1)])  # the schedule's order differs
    degraded = get_strategy("recycle").layout_for(
        _config(strategy="recycle", recycle_spill=False, dp=2, pp=2, microbatches=3, global_batch=24),
        [[0, 1], [2, None]],
    )
    plan = grad_plan(degraded, home_pipelines(config))
    assert not runs_in_order(plan, 1, [(stage1, m) for m in range(6)])  # two units: its own and the lost one
