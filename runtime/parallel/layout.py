"""The layout of one generation: which node runs which layers for which micro-batch.

A layout is data. Every global micro-batch has a *route*: the ordered (stage, node) hops that carry
it through all layers. A plain DP x PP job has `dp` distinct routes; recycle re-routes one hop of
a lost node's micro-batches to a same-stage peer; oobleck mixes pipelines with different stage
counts; bamboo adds *replicas*, stages a node keeps in sync without running them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runtime.config import JobConfig, LayoutError
from runtime.parallel.partition import estimate_layer_costs, partition_layers

Hop = tuple[int, int]
"""(stage id, node id)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Stage boundaries, per-micro-batch routes and replicas of one generation."""

    num_layers: int
    """Layers of the model."""
    stages: tuple[tuple[int, int], ...]
    """Stage id -> `[lo, hi)` layer range. Uniform layouts use ids 0..pp-1."""
    routes: tuple[tuple[Hop, ...], ...]
    """Per global micro-batch, the (stage, node) hops in layer order."""
    pipeline_of: tuple[int, ...]
    """Per global micro-batch, the pipeline it belongs to (for priorities and printing)."""
    microbatch_size: int
    """Samples per micro-batch."""
    replicas: tuple[Hop, ...] = ()
    """(stage, node): a redundant copy of the stage that the node keeps up to date (bamboo)."""
    standby: tuple[int, ...] = ()
    """Members that hold no work in this generation (spares waiting for a hole to fill)."""

    def with_routes(self, routes: Iterable[Iterable[Hop]], pipeline_of: Iterable[int] | None = None, *,
                    replicas: Iterable[Hop] = ()) -> Layout:
        """These stages with other routes (a strategy re-routing micro-batches around lost nodes): the
        same layers, stages and micro-batch size, `pipeline_of` kept unless given, no standby."""
        return Layout(
            num_layers=self.num_layers,
            stages=self.stages,
            routes=tuple(tuple(r) for r in routes),
            pipeline_of=tuple(pipeline_of) if pipeline_of is not None else self.pipeline_of,
            microbatch_size=self.microbatch_size,
            replicas=tuple(replicas),
        )

    # -- derived views ------------------------------------------------------------------------
    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step."""
        return len(self.routes)

    def nodes(self) -> tuple[int, ...]:
        """Every member of the generation, sorted (their index is their process-group rank)."""
        found = {node for route in dict.fromkeys(self.routes) for _, node in route}  # routes repeat
        found |= {node for _, node in self.replicas} | set(self.standby)
        return tuple(sorted(found))

    def hosted(self, node: int) -> tuple[int, ...]:
        """Stage ids the node executes for at least one micro-batch, in layer order."""
        stages = {stage for route in self.routes for stage, n in route if n == node}
        return tuple(sorted(stages, key=lambda s: self.stages[s]))

    def replica_stages(self, node: int) -> tuple[int, ...]:
        """Stage ids the node only keeps a copy of."""
        hosted = set(self.hosted(node))
        return tuple(sorted({s for s, n in self.replicas if n == node and s not in hosted}))

    def layers_of(self, node: int) -> set[int]:
        """Every layer whose state the node must hold (hosted and replicated stages)."""
        layers: set[int] = set()
        for stage in self.hosted(node) + self.replica_stages(node):
            lo, hi = self.stages[stage]
            layers.update(range(lo, hi))
        return layers

    def layers_by_node(self) -> dict[int, set[int]]:
        """`layers_of` of every node, in one pass over the routes (`layers_of` for each node would
        rescan all routes each time: seconds at a thousand nodes)."""
        stages_of: dict[int, set[int]] = {}
        for route in dict.fromkeys(self.routes):  # a pipeline's micro-batches mostly share a route
            for stage, node in route:
                stages_of.setdefault(node, set()).add(stage)
        for stage, node in self.replicas:
            stages_of.setdefault(node, set()).add(stage)
        return {node: {layer for stage in stages for layer in range(*self.stages[stage])}
                for node, stages in stages_of.items()}

    def owner_runs(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """Maximal layer runs `(lo, hi, owners)` held by the same node set: one gradient all-reduce each."""
        holders: list[list[int]] = [[] for _ in range(self.num_layers)]
        layers = self.layers_by_node()
        for node in sorted(layers):  # each layer's owners in node order, one pass over what nodes hold
            for layer in layers[node]:
                if 0 <= layer < self.num_layers:
                    holders[layer].append(node)
        runs: list[tuple[int, int, tuple[int, ...]]] = []
        for layer, owners in enumerate(map(tuple, holders)):
            if runs and runs[-1][2] == owners and runs[-1][1] == layer:
                runs[-1] = (runs[-1][0], layer + 1, owners)
            else:
                runs.append((layer, layer + 1, owners))
        return runs

    def pipelines(self) -> dict[int, tuple[int, ...]]:
        """Pipeline id -> nodes of its first micro-batch's route (for printing)."""
        out: dict[int, tuple[int, ...]] = {}
        for route, p in zip(self.routes, self.pipeline_of, strict=True):
            out.setdefault(p, tuple(n for _, n in route))
        return out

    # -- checks and serialisation -------------------------------------------------------------
    def validate(self) -> None:
        """Raise `LayoutError` unless every route covers all layers once, in order."""
        if len(self.pipeline_of) != len(self.routes):
            raise LayoutError(f"pipeline_of has {len(self.pipeline_of)} entries; expected {len(self.routes)}")
        for stage, (lo, hi) in enumerate(self.stages):
            if not 0 <= lo < hi <= self.num_layers:
                raise LayoutError(
                    f"stage {stage} covers layers [{lo}, {hi}); expected 0 <= lo < hi <= {self.num_layers}"
                )
        # Each distinct route once (a pipeline's micro-batches mostly share one); the first failing
        # route in order of first use is the first failing micro-batch's.
        for route in dict.fromkeys(self.routes):
            at = 0
            for stage, _node in route:
                if not 0 <= stage < len(self.stages):
                    raise LayoutError(
                        f"micro-batch {self.routes.index(route)} uses stage {stage}; "
                        f"expected 0..{len(self.stages) - 1}"
                    )
                lo, hi = self.stages[stage]
                if lo != at:
                    raise LayoutError(
                        f"micro-batch {self.routes.index(route)} jumps to layer {lo} after layer {at - 1}; "
                        f"expected {at}"
                    )
                at = hi
            if at != self.num_layers:
                raise LayoutError(
                    f"micro-batch {self.routes.index(route)} stops at layer {at}; expected {self.num_layers}"
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "num_layers": self.num_layers,
            "stages": [list(s) for s in self.stages],
            "routes": [[list(h) for h in r] for r in self.routes],
            "pipeline_of": list(self.pipeline_of),
            "microbatch_size": self.microbatch_size,
            "replicas": [list(h) for h in self.replicas],
            "standby": list(self.standby),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        """Inverse of `to_dict`."""
        return cls(
            num_layers=d["num_layers"],
            stages=tuple(tuple(s) for s in d["stages"]),
            routes=tuple(tuple((h[0], h[1]) for h in r) for r in d["routes"]),
            pipeline_of=tuple(d["pipeline_of"]),
            microbatch_size=d["microbatch_size"],
            replicas=tuple((h[0], h[1]) for h in d["replicas"]),
            standby=tuple(d["standby"]),
        )


def split_microbatches(total: int, weights: list[int]) -> list[int]:
    """Share `total` micro-batches among pipelines in proportion to `weights` (largest remainder)."""
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares


def pipelines_layout(
    config: JobConfig,
    pipelines: list[list[int]],
    *,
    costs: list[float] | None = None,
    standby: tuple[int, ...] = (),
) -> Layout:
    """A layout of independent pipelines (lists of nodes), each cut into len(nodes) balanced stages.

    Micro-batches go to pipelines in contiguous blocks, in proportion to their node counts, so the
    global batch is the same for any set of pipelines.
    """
    if not pipelines:
        raise LayoutError("no pipeline to run; expected at least one list of nodes")
    costs = costs or config.layer_costs or estimate_layer_costs(config.model)
    parameters = config.model.layer_parameters()
    stage_ids: dict[tuple[int, int], int] = {}
    chains = []
    for nodes in pipelines:
        bounds = partition_layers(costs, len(nodes), parameters=parameters)
        chain = []
        for bound, node in zip(bounds, nodes, strict=True):
            chain.append((stage_ids.setdefault(bound, len(stage_ids)), node))
        chains.append(tuple(chain))
    shares = split_microbatches(config.num_microbatches, [len(p) for p in pipelines])
    routes, owner = [], []
    for p, (chain, share) in enumerate(zip(chains, shares, strict=True)):
        routes += [chain] * share
        owner += [p] * share
    stages = tuple(sorted(stage_ids, key=stage_ids.__getitem__))
    layout = Layout(
        num_layers=config.model.num_layers,
        stages=stages,
        routes=tuple(routes),
        pipeline_of=tuple(owner),
        microbatch_size=config.microbatch_size,
        standby=standby,
    )
    layout.validate()
    return layout
