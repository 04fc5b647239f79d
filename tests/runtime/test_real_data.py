"""Same math on real data: a byte-level GPT trains on real text (a Python standard library source
file) through kills and notices, and ends with the parameters and the validation losses of the
failure-free single-process run, for every fault-tolerant strategy."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.config import DataSpec, JobConfig, ModelSpec
from runtime.data.dataset import Batches
from runtime.train.launcher import Fault, RunResult, run_local
from runtime.train.reference import reference_run
from tests.runtime.conftest import assert_same_math, small_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(120)]

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"


@pytest.fixture(scope="module")
def byte_tokens(tmp_path_factory) -> Path:
    """The corpus as a nanoGPT token file of its UTF-8 bytes (what the byte tokenizer produces)."""
    path = tmp_path_factory.mktemp("data") / "argparse.bin"
    np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8).astype(np.uint16).tofile(path)
    return path


def text_config(tokens: Path, **kw) -> JobConfig:
    """DP=2 x PP=2 tiny byte-level GPT on real text, validated every 2 steps."""
    base = dict(
        model=ModelSpec(kind="gpt", n_layer=2, n_embd=16, n_head=2, seq_len=16, vocab_size=256),
        data=DataSpec(source=f"tokens:{tokens}", val_batches=2),
        val_every=2,
        steps=6,
    )
    base.update(kw)
    return small_config(**base)


def val_losses(result: RunResult) -> dict[int, list[float]]:
    """Every validation loss any node reported, by step."""
    out: dict[int, list[float]] = {}
    for record in result.steps():
        if "val_loss" in record:
            out.setdefault(record["step"], []).append(record["val_loss"])
    return out


def assert_same_validation(result: RunResult, config: JobConfig) -> None:
    expected = reference_run(config).val_losses
    got = val_losses(result)
    assert sorted(got) == sorted(expected) == [1, 3, 5]
    for step, values in got.items():
        for value in values:
            torch.testing.assert_close(value, expected[step], msg=f"validation loss after step {step}")


def test_the_sampler_reads_the_corpus_windows(byte_tokens: Path) -> None:
    config = text_config(byte_tokens)
    corpus = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8).astype(np.int64)
    x, y = Batches(config).train(step=3, index=1, size=config.microbatch_size)
    # Every row is a window of the corpus (at a multiple of seq_len), the target shifted by one.
    for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
        starts = [s for s in range(0, len(corpus) - 16, 16) if (corpus[s : s + 16] == row_x).all()]
        assert starts, "a training row is not a window of the corpus"
        assert (corpus[starts[0] + 1 : starts[0] + 17] == row_y).all()


@pytest.mark.parametrize("kind", ["kill", "notice"])
@pytest.mark.parametrize("strategy", ["recycle", "bamboo", "oobleck", "checkpoint"])
def test_real_text_same_math_under_failures(byte_tokens: Path, tmp_path: Path, strategy: str, kind: str) -> None:
    extra = {"checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_interval": 2} if strategy == "checkpoint" else {}
    config = text_config(byte_tokens, strategy=strategy, **extra)
    result = run_local(config, faults=[Fault(node=1, kind=kind, step=2)], timeout_s=100)
    assert result.exit_codes[1] == (-9 if kind == "kill" else 0), result.exit_codes
    assert_same_math(result, config)
    assert_same_validation(result, config)
    losses = reference_run(config).losses
    assert losses[-1] < losses[0], "the model does not learn from real text"


def test_killed_during_validation_the_next_generation_validates_again(byte_tokens: Path) -> None:
    # Node 2 dies in the validation pass after step 4: the survivors regroup at step 4 and
    # validate the same parameters again before going on, getting the failure-free value.
    config = text_config(byte_tokens, strategy="recycle")
    result = run_local(config, faults=[Fault(node=2, kind="kill", step=4, phase="validation", at=1)], timeout_s=100)
    assert result.exit_codes[2] == -9
    regroups = [r for r in result.records if r.get("event") == "generation" and r["generation"] == 1]
    assert regroups and all(r["start_step"] == 4 for r in regroups)
    assert_same_math(result, config)
    assert_same_validation(result, config)


def test_data_a_node_cannot_read_fails_the_job_once_with_the_reason(tmp_path: Path) -> None:
    config = text_config(tmp_path / "missing.bin")
    result = run_local(config, timeout_s=60)
    failures = {r["reason"] for r in result.records if r.get("event") == "job_failed"}
    assert failures == {f"data: token file {tmp_path / 'missing.bin'} does not exist on this node"}
    assert all(code not in (0, None) for code in result.exit_codes.values()), result.exit_codes
    assert not result.steps()
