"""A user's model checked on the job's data before a fleet is bought (`spotpipe submit`), before a
local run (`spotpipe train`) and on a job's first node (`runtime.train.node_profile`, the trainer):
the model's own checks (`runtime.models.usermodel.check_layers`), then a dry forward of one
micro-batch of the job's data, each layer's measures (`runtime.planner.meta_features`) and, when
asked, its forward+backward time."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from runtime.config import JobConfig
from runtime.data.dataset import Batches, DataError, stand_in_windows
from runtime.models.usermodel import ModelReport, build_user_layer, check_layers, dry_forward
from runtime.planner.meta_features import measure_layers_per_sample


def validate_model(config: JobConfig, *, batches: Any = None, profile: bool = True,
                   need_data: bool = True) -> ModelReport:
    """Check a user's model before any process starts; raises `ModelError` with one message naming
    what is wrong and what was expected: not importable, wrong return type, fewer layers with
    parameters than pipeline stages (a layer without joins a neighbour's stage), non-deterministic
    initialisation, a layer whose output cannot feed the next (a dry forward of one micro-batch on the
    meta device), a loss that cannot take the output. It measures each layer on the meta device
    (`LayerMeasure`) and, with `profile`, times forward+backward per layer on that micro-batch.
    Without `need_data`, data this machine cannot open (a path only the nodes have) are stood in for
    by token windows of zeros when the data are token windows (their shape is known), else the dry
    forward, the measures and the profile are skipped (the nodes run them at start)."""
    report, layers = check_layers(config)
    try:
        batches = batches if batches is not None else Batches(config)
    except DataError:
        if need_data:
            raise
        if config.tokens_per_sample is None:
            return report
        # Token windows have one shape and type whatever the data: the model is checked and measured on them.
        x, y = stand_in_windows(config.tokens_per_sample, config.microbatch_size)
    else:
        x, y = batches.train(step=0, index=0, size=config.microbatch_size)
    with torch.device("meta"):
        meta = [build_user_layer(config.model, i, config.seed) for i in range(report.num_layers)]
    report.boundaries = dry_forward(config, meta, x, y)
    report.measures = measure_layers_per_sample(meta, x)
    if profile:
        report.layer_costs = time_layers(layers, x)
    return report


def time_layers(layers: list, x: object, *, repeats: int = 3) -> list[float]:
    """Best-of-`repeats` forward+backward seconds of each layer in turn, fed by the previous one's
    output (`x`: the first layer's input); runs on copies, so `layers` are left unchanged."""
    costs = []
    for layer in layers:
        layer = copy.deepcopy(layer)
        inp = x.detach().requires_grad_() if x.is_floating_point() else x
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            out = layer(inp)
            out.float().sum().backward()
            best = min(best, time.perf_counter() - start)
        costs.append(max(best, 1e-6))
        with torch.no_grad():
            x = layer(inp).detach()
    return costs
