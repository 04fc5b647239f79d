"""Helpers for the runtime tests: small configs and parity checks against the single-process reference."""

from __future__ import annotations

import functools
import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from runtime.config import JobConfig, ModelSpec
from runtime.train.launcher import RunResult
from runtime.train.reference import train_reference


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


def gloo_pair(target: Callable[..., None], *args: Any, answers: int = 1, timeout_s: float = 60.0) -> list[Any]:
    """Run `target(rank, port, *args, results)` in two spawned processes (ranks 0 and 1) that meet
    at one TCPStore on `port`, and return the first `answers` items they put on `results`. The key
    "finished" is set on that store once the answers are in (or time ran out), for a target that
    must stay up until then."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = [ctx.Process(target=target, args=(rank, master.port, *args, results), daemon=True) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    try:
        return [results.get(timeout=timeout_s) for _ in range(answers)]
    finally:
        master.set("finished", "1")
        for proc in procs:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.kill()
