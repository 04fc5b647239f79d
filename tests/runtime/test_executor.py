"""Failure-free multi-process runs over gloo match the single-process reference exactly."""

from __future__ import annotations

import pytest

from runtime.config import LayoutError, ModelSpec
from runtime.train.launcher import run_local
from tests.runtime.conftest import assert_same_math, small_config


@pytest.mark.runtime
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("strategy", "schedule"), [("none", "1f1b"), ("recycle", "fiw"), ("bamboo", "1f1b"), ("oobleck", "fiw")]
)
def test_failure_free_matches_reference(strategy: str, schedule: str) -> None:
    config = small_config(strategy=strategy, schedule=schedule)
    result = run_local(config, timeout_s=50)
    assert all(code == 0 for code in result.exit_codes.values()), result.exit_codes
    assert_same_math(result, config)
    steps = {r["step"] for r in result.steps()}
    assert steps == set(range(config.steps))


@pytest.mark.runtime
@pytest.mark.timeout(60)
def test_gpt_dp2_pp2_matches_reference() -> None:
    config = small_config(
        model=ModelSpec(kind="gpt", n_layer=2, n_embd=16, n_head=2, seq_len=8, vocab_size=32), steps=3
    )
    result = run_local(config, timeout_s=50)
    assert_same_math(result, config)
    losses = [r["loss"] for r in result.steps() if r["node"] == 0]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)


@pytest.mark.timeout(10)
def test_impossible_layout_fails_before_any_process() -> None:
    with pytest.raises(LayoutError, match=r"pp=5 stages but the model has only 4 layers"):
        run_local(small_config(pp=5))
    with pytest.raises(LayoutError, match=r"global_batch=10 is not divisible by dp\*microbatches=4"):
        run_local(small_config(global_batch=10))
