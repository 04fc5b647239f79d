"""`precision: "bf16"` (issue 19): each layer's forward (and its recompute) under bfloat16 autocast,
parameters, gradients and AdamW state in float32, and the same-math guarantee kept: a bf16 run under
a kill equals the failure-free bf16 run bit for bit."""

from __future__ import annotations

import pytest
import torch

from runtime.config import JobConfig, LayoutError, ModelSpec, build_job_config
from runtime.train.launcher import Fault, run_local
from runtime.train.reference import reference_run
from tests.runtime.conftest import assert_same_math, small_config

GPT = ModelSpec(kind="gpt", n_layer=2, n_embd=16, n_head=2, seq_len=8, vocab_size=32)


def test_precision_is_validated_by_name() -> None:
    assert JobConfig().precision == "fp32"
    assert JobConfig(precision="bf16").problems() == []
    assert JobConfig(precision="fp16").problems() == []
    with pytest.raises(LayoutError) as info:  # what the control plane builds: a 400 naming the field
        build_job_config({"precision": "fp8"}, dp=1, pp=1, microbatches=1, strategy="recycle", steps=1)
    assert info.value.field == "precision" and "'fp8' is unknown" in info.value.message


def test_train_flag_sets_precision() -> None:
    from spotpipe.cli import build_parser
    from spotpipe.train import TrainOptions, resolve_config

    args = build_parser().parse_args(["train", "--precision", "bf16"])
    assert resolve_config(TrainOptions(precision=args.precision)).precision == "bf16"
    assert resolve_config(TrainOptions()).precision == "fp32"
    assert build_parser().parse_args(["train", "--precision", "fp16"]).precision == "fp16"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--precision", "fp8"])


def test_bf16_computes_in_bf16_and_keeps_float32_state() -> None:
    fp32 = reference_run(small_config(model=GPT, steps=2))
    bf16 = reference_run(small_config(model=GPT, steps=2, precision="bf16"))
    assert all(p.dtype == torch.float32 for p in bf16.params.values())
    assert any(not torch.equal(fp32.params[k], bf16.params[k]) for k in fp32.params)  # autocast ran
    for k in fp32.params:  # ... and it is the same training, rounded differently
        torch.testing.assert_close(bf16.params[k], fp32.params[k], rtol=0.05, atol=0.05)
    # recompute replays the forward under the same autocast state: the same bits
    again = reference_run(small_config(model=GPT, steps=2, precision="bf16", recompute=True))
    assert all(torch.equal(bf16.params[k], again.params[k]) for k in bf16.params)


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_bf16_under_a_kill_equals_the_failure_free_bf16_run() -> None:
    config = small_config(model=GPT, strategy="recycle", steps=4, precision="bf16")
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=2)], timeout_s=100)
    assert result.exit_codes[1] == -9, result.exit_codes
    # Against the single-process bf16 run, bit for bit (it differs from the fp32 run: see above, so
    # workers that ignored `precision` would fail here).
    assert_same_math(result, config)
    assert all(t.dtype == torch.float32 for t in result.params.values())
