"""`oobleck`: pipeline templates for every node count; re-instantiate them after a change.

A template for n nodes is a list of pipeline sizes (as few pipelines of at most `pp` nodes as
possible, sizes differing by at most one, none below `min_stages`). Each pipeline of k nodes is cut
into k stages balanced by layer cost, and micro-batches are shared in proportion to pipeline size so
the global batch never changes. Layers a node newly hosts are copied from surviving replicas.
"""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Layout, pipelines_layout
from runtime.strategies.base import Slots, alive_nodes


def pipeline_templates(config: JobConfig) -> dict[int, list[int]]:
    """Node count -> pipeline sizes, for every count from the smallest that fits to dp * pp."""
    out = {}
    for n in range(1, config.num_nodes + 1):
        k = -(-n // config.pp)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        if min(sizes) >= config.min_stages and max(sizes) <= config.model.max_stages:
            out[n] = sizes
    return out


class OobleckStrategy:
    """Re-instantiate pipelines from templates over the surviving nodes (slot order)."""

    name = "oobleck"
    decision = "reinstantiate"
    restarts_from_checkpoint = False
    falls_back_to_checkpoint = True
    simulated_schedule = "1f1b"
    plans_from_count = True
    plans_per_row = False
    rows_interchangeable = True
    recovery_s = 30.0 + 5.0  # re-instantiating the pipelines, then detection
    batches_joiners = True  # every regroup re-instantiates the pipelines

    def layout_for(self, config: JobConfig, slots: Slots) -> Layout:
        nodes = alive_nodes(slots)
        templates = pipeline_templates(config)
        if len(nodes) not in templates:
            covered = f"{min(templates)}..{max(templates)}" if templates else "none"
            raise LayoutError(
                f"{len(nodes)} nodes: no pipeline template covers this count; "
                f"templates cover {covered} nodes (pp={config.pp}, min_stages={config.min_stages})"
            )
        chunks, at = [], 0
        for size in templates[len(nodes)]:
            chunks.append(nodes[at : at + size])
            at += size
        return pipelines_layout(config, chunks)
