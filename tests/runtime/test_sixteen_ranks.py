"""Same math past 8 ranks: 16 real processes (DP=4 x PP=4) lose one node, then two at once, then
give a third a notice, and end with the bits of the failure-free 16-rank run (and of the
single-process reference). Emulated device time keeps the 16 processes' steps overlapping on 2 cores."""

from __future__ import annotations

import pytest
import torch

from bench.runtime_ranks import rank_config as bench_rank_config
from runtime.config import JobConfig
from runtime.train.launcher import Fault, RunResult, run_local
from tests.runtime.conftest import assert_same_math

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(150)]

FAULTS = [
    Fault(node=5, kind="kill", step=1),  # pipeline 1, stage 1
    Fault(node=6, kind="kill", step=3),  # pipeline 1, stage 2 ...
    Fault(node=9, kind="kill", step=3),  # ... and pipeline 2, stage 1 in the same step
    Fault(node=10, kind="notice", step=4),  # pipeline 2, stage 2 leaves cleanly
]


def _config() -> JobConfig:
    # The same job `python -m bench runtime` runs past 8 ranks (one owner of its settings).
    return bench_rank_config(dp=4, pp=4, steps=6)


def _generations(result: RunResult) -> list[dict]:
    return [r for r in result.records if r.get("event") == "generation" and r["node"] == 0]


def test_sixteen_ranks_kill_one_then_two_then_notice_keep_the_math() -> None:
    config = _config()
    free = run_local(config, timeout_s=60)
    faulted = run_local(config, faults=FAULTS, timeout_s=60)
    assert all(code == 0 for code in free.exit_codes.values()), free.exit_codes
    assert [faulted.exit_codes[n] for n in (5, 6, 9, 10)] == [-9, -9, -9, 0], faulted.exit_codes
    survivors = [n for n in range(16) if n not in (5, 6, 9, 10)]
    assert all(faulted.exit_codes[n] == 0 for n in survivors), faulted.exit_codes
    lost = [sorted(g["lost"]) for g in _generations(faulted) if g["lost"]]
    assert lost == [[5], [6, 9]], lost
    assert [g["reason"] for g in _generations(faulted)][-1] == "notice"
    assert set(free.params) == set(faulted.params)
    for name, expected in free.params.items():
        torch.testing.assert_close(faulted.params[name], expected, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert_same_math(faulted, config)
