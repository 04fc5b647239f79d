"""Helpers for the runtime tests: small configs and parity checks against the single-process reference."""

from __future__ import annotations

import functools

import torch

from runtime.config import JobConfig, ModelSpec
from runtime.launcher import RunResult
from runtime.reference import train_reference


def small_config(**kw) -> JobConfig:
    """DP=2 x PP=2 tiny MLP: fast enough to run many real multi-process jobs."""
    base = dict(
        dp=2,
        pp=2,
        microbatches=2,
        global_batch=8,
        steps=4,
        model=ModelSpec(n_layer=2),
        op_timeout_s=2.0,
        heartbeat_timeout_s=4.0,
    )
    base.update(kw)
    return JobConfig(**base)


@functools.lru_cache(maxsize=32)
def _reference(config_json: str) -> dict[str, torch.Tensor]:
    import json

    return train_reference(JobConfig.from_dict(json.loads(config_json)))[0]


def assert_same_math(result: RunResult, config: JobConfig) -> None:
    """Every parameter equals the failure-free single-process run bit for bit (`grad_order` fixes
    the summation order), and every copy of a parameter (DP replicas, bamboo replicas) too."""
    import json

    reference = _reference(json.dumps(config.to_dict(), sort_keys=True))
    assert set(result.params) == set(reference), "the finished nodes do not hold the whole model"
    for name, expected in reference.items():
        for copy in result.replicas[name]:
            torch.testing.assert_close(copy, expected, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
