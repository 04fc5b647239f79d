"""Gradients summed in one fixed order, whatever node computed which micro-batch.

Floating-point addition is not associative, so where a micro-batch's gradient is added changes the
low bits of the sum. Re-routing (recycle), re-instantiated pipelines (oobleck) or a take-over
(bamboo) would each change the order, and over thousands of steps such differences grow into
visibly different parameters (docs/reliability.md measured 1.4 after 3,600 steps). So every layer's
gradient is the same expression in every generation:

    sum over home pipelines g, ascending:  ((mb_g0 + mb_g1) + mb_g2) + ...   (micro-batches ascending)

A micro-batch's *home* pipeline is its pipeline in the job's failure-free layout. A node adds up, per
layer, the longest run from the start of a home pipeline's chain that it computes itself (the
*prefix*, accumulated as autograd would) and keeps any other micro-batch of that pipeline alone (a
*single*); the all-reduce exchanges these units and every owner folds them in the order above.
Failure-free, every node computes whole chains, so it sends one unit per layer, as before; only a
pipeline split across nodes (e.g. round-robin re-routing at DP > 2) sends singles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from runtime.config import JobConfig
from runtime.parallel.layout import Layout
from runtime.strategies import initial_layout

Unit = tuple[int, int]
"""(home pipeline, first micro-batch of the unit): sorting units sorts them in summation order."""


@dataclass(frozen=True)
class GradPlan:
    """For one layout: the unit of every (layer, micro-batch) and which node holds which unit."""

    unit_of: dict[tuple[int, int], Unit]
    """(layer, micro-batch) -> the unit its gradient is added into."""
    members: dict[tuple[int, Unit], tuple[int, ...]]
    """(layer, unit) -> its micro-batches in the order they are added."""
    held: dict[tuple[int, int], tuple[Unit, ...]]
    """(node, layer) -> the units that node computes, sorted."""

    def units(self, node: int, layer: int) -> tuple[Unit, ...]:
        return self.held.get((node, layer), ())


def home_pipelines(config: JobConfig) -> tuple[int, ...]:
    """Each micro-batch's pipeline in the job's failure-free layout."""
    return initial_layout(config).pipeline_of


def grad_plan(layout: Layout, home: Sequence[int]) -> GradPlan:
    """The accumulation units of `layout`, given each micro-batch's home pipeline."""
    if len(home) != layout.num_microbatches:
        raise ValueError(
            f"home pipelines cover {len(home)} micro-batches; expected {layout.num_microbatches}"
        )
    unit_of: dict[tuple[int, int], Unit] = {}
    members: dict[tuple[int, Unit], tuple[int, ...]] = {}
    held: dict[tuple[int, int], list[Unit]] = {}
    for layer in range(layout.num_layers):
        node_of = [_node_computing(layout, m, layer) for m in range(layout.num_microbatches)]
        for g in sorted(set(home)):
            chain = [m for m in range(layout.num_microbatches) if home[m] == g]
            first = node_of[chain[0]]
            k = 1
            while k < len(chain) and node_of[chain[k]] == first:
                k += 1
            pieces = [(chain[0], chain[:k])] + [(m, [m]) for m in chain[k:]]
            for start, mbs in pieces:
                unit = (g, start)
                members[(layer, unit)] = tuple(mbs)
                held.setdefault((node_of[start], layer), []).append(unit)
                for m in mbs:
                    unit_of[(layer, m)] = unit
    return GradPlan(unit_of, members, {key: tuple(sorted(units)) for key, units in held.items()})


def _node_computing(layout: Layout, mb: int, layer: int) -> int:
    for stage, node in layout.routes[mb]:
        lo, hi = layout.stages[stage]
        if lo <= layer < hi:
            return node
    raise ValueError(f"micro-batch {mb}'s route does not cover layer {layer}")


class GradAccumulator:
    """One node's gradient units for one step.

    Around each backward, `begin` points the parameters' `.grad` at the unit being built (autograd
    then adds into it, as it always does) and `end` takes the result back. A micro-batch whose turn
    in its unit has not come yet is computed into a fresh gradient and added when its turn comes, so
    the schedule's order never changes the sum.

    `in_order` (see `runs_in_order`): this node holds one unit per layer and its schedule runs the
    unit's micro-batches in summation order, so autograd's own accumulation into `.grad` already is
    the unit: `begin` and `end` have nothing to do (the failure-free case: no cost at all).
    """

    def __init__(
        self,
        plan: GradPlan,
        node: int,
        params_of_layer: dict[int, list[torch.nn.Parameter]],
        *,
        in_order: bool = False,
    ) -> None:
        self.plan = plan
        self.node = node
        self.params_of_layer = params_of_layer
        self.in_order = in_order
        self.sums: dict[tuple[int, Unit], list[torch.Tensor]] = {}
        self.added: dict[tuple[int, Unit], int] = {}
        self.early: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._open: list[tuple[int, Unit, int, bool]] = []

    def begin(self, layers: range, mb: int) -> None:
        """Before the backward of `mb` over `layers`: set each parameter's `.grad` to what autograd
        should add this micro-batch's gradient into."""
        self._open = []
        if self.in_order:
            return
        for layer in layers:
            unit = self.plan.unit_of[(layer, mb)]
            key = (layer, unit)
            in_turn = self.plan.members[key][self.added.get(key, 0)] == mb
            current = self.sums.get(key) if in_turn else None
            for i, p in enumerate(self.params_of_layer[layer]):
                p.grad = None if current is None else current[i]
            self._open.append((layer, unit, mb, in_turn))

    def end(self) -> None:
        """After the backward: keep the gradients, add early ones whose turn has come."""
        for layer, unit, mb, in_turn in self._open:
            params = self.params_of_layer[layer]
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            for p in params:
                p.grad = None
            key = (layer, unit)
            if not in_turn:
                self.early[(layer, mb)] = grads
                continue
            self.sums[key] = grads
            self.added[key] = self.added.get(key, 0) + 1
            order = self.plan.members[key]
            while self.added[key] < len(order) and (layer, order[self.added[key]]) in self.early:
                for total, grad in zip(grads, self.early.pop((layer, order[self.added[key]])), strict=True):
                    total.add_(grad)
                self.added[key] += 1
        self._open = []

    def contribution(self, lo: int, hi: int) -> torch.Tensor:
        """This node's units for layers [lo, hi), flattened in the order every owner expects."""
        pieces = []
        if self.in_order:
            for layer in range(lo, hi):
                if self.plan.units(self.node, layer):
                    pieces += [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                               for p in self.params_of_layer[layer]]
            return torch.cat(pieces) if pieces else torch.empty(0)
        for layer in range(lo, hi):
            for unit in self.plan.units(self.node, layer):
                key = (layer, unit)
                if self.added.get(key, 0) != len(self.plan.members[key]):
                    raise RuntimeError(
                        f"layer {layer}: unit {unit} has {self.added.get(key, 0)} of "
                        f"{len(self.plan.members[key])} micro-batches at its all-reduce"
                    )
                pieces += [g.reshape(-1) for g in self.sums.pop(key)]
        return torch.cat(pieces) if pieces else torch.empty(0)


def runs_in_order(plan: GradPlan, node: int, backwards: list[tuple[range, int]]) -> bool:
    """Whether `node` holds at most one unit per layer and `backwards` (its schedule's parameter-
    gradient actions in order, as (layers, micro-batch)) add each unit's micro-batches in their
    summation order: then `GradAccumulator(in_order=True)` gives the same bits with no work."""
    seen: dict[int, list[int]] = {}
    for layers, mb in backwards:
        for layer in layers:
            seen.setdefault(layer, []).append(mb)
    for layer, mbs in seen.items():
        units = plan.units(node, layer)
        if len(units) != 1 or tuple(mbs) != plan.members[(layer, units[0])]:
            return False
    return True


Window = tuple[int, int]
"""An element range [start, stop) of a layer run's flat, finished gradient."""


def chunk_windows(numel: int, parts: int) -> list[Window]:
    """`numel` elements cut into `parts` contiguous windows of near-equal size (the reduce-scatter's
    chunks, one per computing owner, in owner order)."""
    return [(c * numel // parts, (c + 1) * numel // parts) for c in range(parts)]


def _layer_cuts(lo: int, hi: int, layer_numel: dict[int, int], window: Window | None) -> list[tuple[int, int, int]]:
    """(layer, start, stop) inside each layer of [lo, hi) that `window` of the flat run covers."""
    a, b = window if window is not None else (0, sum(layer_numel[layer] for layer in range(lo, hi)))
    cuts, at = [], 0
    for layer in range(lo, hi):
        start, stop = max(a - at, 0), min(b - at, layer_numel[layer])
        if start < stop:
            cuts.append((layer, start, stop))
        at += layer_numel[layer]
    return cuts


@dataclass(frozen=True)
class RunSum:
    """The fixed-order sum of one layer run [lo, hi) over its computing owners, by window.

    Every addition of `fold` is element-wise, so the sum of a window, folded from the windows of the
    owners' contributions, has the bits of the same window of the whole sum: the reduce-scatter
    (`runtime.distributed.comm`) lets each chunk's owner fold its chunk alone and stays bit-identical."""

    plan: GradPlan
    lo: int
    hi: int
    layer_numel: dict[int, int]

    @property
    def numel(self) -> int:
        """Size of the finished (flat) sum."""
        return sum(self.layer_numel[layer] for layer in range(self.lo, self.hi))

    def piece_numel(self, node: int, window: Window | None = None) -> int:
        """Size of `node`'s contribution restricted to `window` (None: the whole run)."""
        cuts = _layer_cuts(self.lo, self.hi, self.layer_numel, window)
        return sum(len(self.plan.units(node, layer)) * (stop - start) for layer, start, stop in cuts)

    def piece(self, node: int, flat: torch.Tensor, window: Window) -> torch.Tensor:
        """`node`'s contribution `flat` (whole run, as `GradAccumulator.contribution` lays it out)
        restricted to `window`, laid out the same way (per layer, per unit)."""
        offsets, at = {}, 0
        for layer in range(self.lo, self.hi):
            offsets[layer] = at
            at += len(self.plan.units(node, layer)) * self.layer_numel[layer]
        pieces = []
        for layer, start, stop in _layer_cuts(self.lo, self.hi, self.layer_numel, window):
            for k in range(len(self.plan.units(node, layer))):
                base = offsets[layer] + k * self.layer_numel[layer]
                pieces.append(flat[base + start : base + stop])
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat(pieces) if pieces else torch.empty(0)

    def fold(self, parts: dict[int, torch.Tensor], window: Window | None = None) -> torch.Tensor:
        """`window` of the finished sum from every computing owner's `piece` of that window."""
        return _fold_cuts(self.plan, parts, _layer_cuts(self.lo, self.hi, self.layer_numel, window))


def contribution_numel(plan: GradPlan, node: int, lo: int, hi: int, layer_numel: dict[int, int]) -> int:
    """Size of `node`'s contribution to the all-reduce of layers [lo, hi)."""
    return RunSum(plan, lo, hi, layer_numel).piece_numel(node)


def fold(
    plan: GradPlan, parts: dict[int, torch.Tensor], lo: int, hi: int, layer_numel: dict[int, int]
) -> torch.Tensor:
    """The gradient of layers [lo, hi), flat, from every owner's contribution, in the fixed order."""
    return RunSum(plan, lo, hi, layer_numel).fold(parts)


def _fold_cuts(plan: GradPlan, parts: dict[int, torch.Tensor], cuts: list[tuple[int, int, int]]) -> torch.Tensor:
    """The sum over the layer pieces `cuts` ((layer, start, stop) each) from each owner's pieces of
    them (per cut, one piece per unit the owner holds), flat, in the fixed summation order."""
    pieces: dict[tuple[int, Unit], torch.Tensor] = {}
    for node, flat in parts.items():
        offset = 0
        for layer, start, stop in cuts:
            for unit in plan.units(node, layer):
                pieces[(layer, unit)] = flat[offset : offset + stop - start]
                offset += stop - start
    result = torch.empty(sum(stop - start for _, start, stop in cuts))
    at = 0
    for layer, start, stop in cuts:
        total = result[at : at + stop - start]
        at += stop - start
        units = sorted(unit for (lay, unit) in pieces if lay == layer)
        if not units:
            total.zero_()
        for n, g in enumerate(sorted({unit[0] for unit in units})):
            chain, owned = None, False
            for unit in (u for u in units if u[0] == g):
                piece = pieces[(layer, unit)]
                if chain is None:
                    chain = piece
                    continue
                if not owned:  # pieces are views of the exchanged buffers: leave them intact
                    chain, owned = chain.clone(), True
                chain.add_(piece)
            if n == 0:
                total.copy_(chain)
            else:
                total.add_(chain)
    return result
