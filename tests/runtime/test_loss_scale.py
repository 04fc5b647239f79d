"""`precision = "fp16"`: float16 autocast with dynamic loss scaling whose scale every node derives from
the job's skipped steps (`runtime.train.loss_scale`), so a kill, a joiner and a checkpoint restart
keep the same math as the single-process reference, overflows included."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.train.launcher import Fault, Join, run_local
from runtime.train.loss_scale import MAX_SCALE, loss_scale_at
from runtime.train.reference import reference_run
from tests.runtime.conftest import assert_same_math, small_config

GPT = ModelSpec(kind="gpt", n_layer=2, n_embd=16, n_head=2, seq_len=8, vocab_size=32)
OVERFLOWING = 2.0**21
"""A first scale at which a float16 backward of this GPT overflows: the first steps are skipped and
the scale halves until it fits (steps 0 and 1 here, measured with the reference; 2**19 never overflows)."""


def test_the_scale_halves_at_each_skip_and_doubles_after_a_run_without_one() -> None:
    config = JobConfig(precision="fp16", loss_scale_init=1024.0, loss_scale_growth_interval=3)
    assert loss_scale_at(config, 0, []) == 1024.0
    assert loss_scale_at(config, 3, []) == 2048.0  # steps 0, 1, 2 went well
    assert loss_scale_at(config, 2, [1]) == 512.0  # step 1 overflowed
    assert loss_scale_at(config, 5, [1]) == 1024.0  # steps 2, 3, 4 went well since
    assert loss_scale_at(config, 5, [3, 1, 9]) == loss_scale_at(config, 5, [1, 3])  # order and later skips
    assert loss_scale_at(config, 10**6, []) == MAX_SCALE
    assert loss_scale_at(config, 40, list(range(40))) == 1.0  # never below 1
    assert loss_scale_at(JobConfig(precision="bf16"), 5, [1]) == 1.0  # only fp16 scales


def test_the_first_scale_must_be_a_power_of_two() -> None:
    for bad in (1000.0, 0.5, float("inf")):
        with pytest.raises(LayoutError, match="loss_scale_init"):
            JobConfig(precision="fp16", loss_scale_init=bad).validate()
    with pytest.raises(LayoutError, match="loss_scale_growth_interval"):
        JobConfig(loss_scale_growth_interval=0).validate()


def test_fp16_overflows_are_skipped_and_the_scale_recovers() -> None:
    run = reference_run(small_config(model=GPT, steps=6, precision="fp16", loss_scale_init=OVERFLOWING))
    assert run.skipped == [0, 1]
    plain = reference_run(small_config(model=GPT, steps=6, precision="fp16"))
    assert plain.skipped == []
    assert all(p.dtype == torch.float32 for p in run.params.values())


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_fp16_under_a_kill_and_a_joiner_keeps_the_math_and_the_scale() -> None:
    # The joiner starts after step 4 knowing nothing: the plan tells it steps 0 and 1 were skipped. With
    # the first scale instead, its float16 backward overflows and every node skips a step it should not.
    config = small_config(model=GPT, strategy="recycle", schedule="fiw", steps=7, precision="fp16",
                          loss_scale_init=OVERFLOWING)
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=3)], joins=[Join(node=4, after_step=4)],
                       timeout_s=100)
    assert result.exit_codes[1] == -9 and result.exit_codes[4] == 0, result.exit_codes
    assert any(r["node"] == 4 for r in result.steps()), "the replacement never trained"
    skipped = {r["step"] for r in result.steps() if r["skipped"]}
    assert skipped == {0, 1}
    assert_same_math(result, config)


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_a_checkpoint_records_the_skips_and_a_restart_continues_the_scale(tmp_path) -> None:
    config = small_config(model=GPT, strategy="checkpoint", steps=7, precision="fp16", loss_scale_init=OVERFLOWING,
                          checkpoint_interval=4, checkpoint_dir=str(tmp_path))
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=5)], timeout_s=100)
    restarts = [r for r in result.records if r.get("event") == "generation" and r["generation"] == 1]
    assert restarts and all(r["start_step"] == 4 for r in restarts)
    info = json.loads((tmp_path / "checkpoints" / "step-4" / "spotpipe.json").read_text())
    assert info["skipped_steps_at"] == [0, 1]
    assert_same_math(result, config)
