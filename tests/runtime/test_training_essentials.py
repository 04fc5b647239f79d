"""Training essentials (issue 19): AdamW betas/eps, weight-decay groups, warmup + cosine learning
rate, global gradient-norm clipping and skipping non-finite steps, all under the same-math
guarantee: a distributed run under failures equals the single-process reference bit for bit."""

from __future__ import annotations

import datetime
import math
import os
import time

import pytest
import torch
import torch.distributed as dist

from runtime.config import DataSpec, JobConfig, LayoutError, ModelSpec, each_error
from runtime.distributed.comm import Comm, PeerAborted
from runtime.train.launcher import Fault, run_local
from runtime.train.model_check import validate_model
from runtime.train.optim import Hyper, LayerState, lr_at
from runtime.train.reference import reference_run
from tests.runtime.conftest import assert_same_math, gloo_pair, small_config
from tests.usermodels.models import Residual

M = "tests.usermodels.models"

ESSENTIALS = dict(clip=1e-3, lr_schedule="cosine", warmup_steps=2, lr_min=1e-3, betas=[0.8, 0.99], eps=1e-6,
                  weight_decay=0.1, weight_decay_min_dim=2)
"""Every new knob away from its default, with a clip so small that every step is clipped."""


def test_lr_schedule_values() -> None:
    constant = JobConfig(lr=0.1, steps=10)
    assert [lr_at(constant, s) for s in (0, 5, 9)] == [0.1, 0.1, 0.1]
    warm = JobConfig(lr=0.1, steps=10, warmup_steps=4)
    assert [lr_at(warm, s) for s in range(5)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])
    cosine = JobConfig(lr=0.1, lr_min=0.01, steps=12, warmup_steps=1, lr_schedule="cosine")
    assert lr_at(cosine, 0) == pytest.approx(0.1)  # the warmup's last step reaches lr
    assert lr_at(cosine, 1) == pytest.approx(0.1)  # the cosine starts at lr ...
    assert lr_at(cosine, 6) == pytest.approx(0.055)  # ... is half-way at the middle ...
    assert lr_at(cosine, 11) == pytest.approx(0.01)  # ... and reaches lr_min at the last step
    assert lr_at(cosine, 20) == pytest.approx(0.01)
    values = [lr_at(cosine, s) for s in range(1, 12)]
    assert values == sorted(values, reverse=True)


def test_new_fields_are_validated_by_name() -> None:
    bad = JobConfig(betas=[0.9], eps=0.0, lr_schedule="linear", warmup_steps=-1, lr_min=1.0, clip=-1.0,
                    weight_decay_min_dim=-1, weight_decay=-0.1)
    fields = {e.field for e in each_error(_problems(bad))}
    assert fields == {"betas", "eps", "lr_schedule", "warmup_steps", "lr_min", "clip", "weight_decay_min_dim",
                      "weight_decay"}
    with pytest.raises(LayoutError, match="betas"):
        JobConfig(betas=[0.9, 1.0]).validate()
    config = JobConfig.from_dict({**JobConfig().to_dict(), **ESSENTIALS})
    config.validate()
    assert JobConfig.from_dict(config.to_dict()) == config
    with pytest.raises(LayoutError, match="clip must be a finite number"):
        JobConfig.from_dict({"clip": "big"})


def _problems(config: JobConfig) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        config.validate()
    return info.value


def test_weight_decay_groups_spare_norms_and_biases() -> None:
    torch.manual_seed(0)
    for min_dim, decayed in ((2, {"fc1.weight", "fc2.weight"}), (0, None)):
        layer = Residual(4)
        before = {n: p.detach().clone() for n, p in layer.named_parameters()}
        state = LayerState(0, layer)
        # Zero gradients: Adam's update is exactly 0, so only the decay can move a parameter.
        state.step([torch.zeros_like(p) for p in state.params], snapshot=False,
                   hyper=Hyper(lr=0.5, weight_decay=0.1, decay_min_dim=min_dim))
        for name, p in layer.named_parameters():
            if decayed is None or name in decayed:
                torch.testing.assert_close(p.detach(), before[name] * (1 - 0.05), rtol=0, atol=0)
            else:  # norm.weight, norm.bias, fc1.bias, fc2.bias
                assert torch.equal(p.detach(), before[name]), name
    assert {n for n, _ in Residual(4).named_parameters()} == {"norm.weight", "norm.bias", "fc1.weight", "fc1.bias",
                                                              "fc2.weight", "fc2.bias"}


def test_reference_clips_and_reports_the_norm() -> None:
    assert reference_run(small_config()).grad_norms == [None] * 4  # neither clip nor skip_nonfinite: no norm
    plain = reference_run(small_config(skip_nonfinite=True))
    assert all(n is not None and n > 0 for n in plain.grad_norms) and plain.skipped == []
    clipped = reference_run(small_config(clip=1e-3))
    assert clipped.grad_norms[0] == plain.grad_norms[0]  # the norm is taken before clipping
    assert any(not torch.equal(plain.params[k], clipped.params[k]) for k in plain.params)
    loose = reference_run(small_config(clip=1e6))  # never reached: the same bits as no clipping
    assert all(torch.equal(plain.params[k], loose.params[k]) for k in plain.params)


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("strategy", "fault"), [("recycle", "kill"), ("bamboo", "notice")])
def test_clipping_under_failures_equals_the_reference(strategy: str, fault: str) -> None:
    config = small_config(strategy=strategy, steps=5, **ESSENTIALS)
    result = run_local(config, faults=[Fault(node=1, kind=fault, step=2)], timeout_s=100)
    assert result.exit_codes[1] == (-9 if fault == "kill" else 0), result.exit_codes
    assert_same_math(result, config)
    norms = reference_run(config).grad_norms
    for record in result.steps():
        assert record["grad_norm"] == norms[record["step"]] and record["skipped"] is False
    assert all(n > config.clip for n in norms)  # every step was clipped


def _inf_config(**kw) -> JobConfig:
    config = JobConfig(model=ModelSpec(kind="py", path=f"{M}:resmlp", loss=f"{M}:huber", args={"width": 8}),
                       data=DataSpec(source="py:tests.runtime._essentials_models:regression_with_inf"),
                       dp=2, pp=2, microbatches=2, global_batch=8, steps=5, op_timeout_s=2.0,
                       heartbeat_timeout_s=4.0, **kw)
    validate_model(config, profile=False).record(config)
    return config


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize("knob", [{"clip": 1.0}, {"skip_nonfinite": True}])
def test_non_finite_step_is_skipped_everywhere_and_counted(knob: dict) -> None:
    config = _inf_config(strategy="recycle", **knob)
    ref = reference_run(config)
    assert ref.skipped == [2], ref.skipped  # the one step that reads the infinite sample
    assert not math.isfinite(ref.grad_norms[2])
    assert all(math.isfinite(n) for i, n in enumerate(ref.grad_norms) if i != 2)
    assert all(torch.isfinite(p).all() for p in ref.params.values())
    # Kill a node in the skipped step: the survivors roll it back and redo it, skipping it again.
    result = run_local(config, faults=[Fault(node=2, kind="kill", step=2)], timeout_s=100)
    assert result.exit_codes[2] == -9, result.exit_codes
    assert_same_math(result, config)
    records = result.steps()
    assert {(r["node"], r["step"]) for r in records if r["skipped"]} == {(0, 2), (1, 2), (3, 2)}
    assert all(r["grad_norm"] is None for r in records if r["skipped"])  # inf/NaN: null in the JSON record
    assert all(r["skipped_steps"] == int(r["step"] >= 2) for r in records)


def test_train_flags_set_the_new_fields() -> None:
    from spotpipe.cli import build_parser
    from spotpipe.train import TrainError, TrainOptions, resolve_config

    args = build_parser().parse_args(["train", "--lr-schedule", "cosine", "--warmup", "3", "--lr-min", "1e-4",
                                      "--clip", "1.0", "--weight-decay", "0.1", "--decay-min-dim", "2",
                                      "--betas", "0.8,0.99", "--eps", "1e-6", "--recompute"])
    options = TrainOptions(lr_schedule=args.lr_schedule, warmup=args.warmup, lr_min=args.lr_min, clip=args.clip,
                           weight_decay=args.weight_decay, decay_min_dim=args.decay_min_dim, betas=args.betas,
                           eps=args.eps, recompute=args.recompute, steps=10)
    config = resolve_config(options)
    assert config.recompute is True
    assert build_parser().parse_args(["train"]).recompute is None
    assert (config.lr_schedule, config.warmup_steps, config.lr_min, config.clip, config.weight_decay,
            config.weight_decay_min_dim, config.betas, config.eps) == \
        ("cosine", 3, 1e-4, 1.0, 0.1, 2, [0.8, 0.99], 1e-6)
    with pytest.raises(TrainError, match="--betas"):
        resolve_config(TrainOptions(betas="0.9;0.95"))
    with pytest.raises(LayoutError, match="betas"):
        resolve_config(TrainOptions(betas="0.9"))
    defaults = resolve_config(TrainOptions())
    assert (defaults.clip, defaults.warmup_steps, defaults.lr_schedule, defaults.weight_decay_min_dim,
            defaults.recompute, defaults.skip_nonfinite) == (0.0, 0, "constant", 0, False, False)
    assert resolve_config(TrainOptions(skip_nonfinite=True)).skip_nonfinite is True


def test_train_flag_sets_device() -> None:
    from spotpipe.cli import build_parser
    from spotpipe.train import TrainOptions, resolve_config

    args = build_parser().parse_args(["train", "--device", "cuda"])
    assert resolve_config(TrainOptions(device=args.device)).device == "cuda"
    assert build_parser().parse_args(["train"]).device is None  # the job file's value, else JobConfig's
    assert resolve_config(TrainOptions()).device == "cpu"
    with pytest.raises(SystemExit):  # argparse refuses it: DEVICES are the choices
        build_parser().parse_args(["train", "--device", "tpu"])


def _norm_exchange(rank: int, port: int, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
    comm = Comm(dist.PrefixStore("t", store), prefix="pg", node=rank, members=[0, 1], timeout_s=10.0)
    if rank == 1:  # abandons the step before its part of the norm exchange
        comm.poison_norms(4)
    else:  # the first member waits for rank 1's part: the poison releases it long before the timeout
        started = time.perf_counter()
        try:
            comm.sum_norms(torch.zeros(4, dtype=torch.float64))
            results.put("summed")
        except PeerAborted as exc:
            results.put(f"aborted after {time.perf_counter() - started:.1f}s: {exc}")
    store.wait(["finished"])
    os._exit(0)


@pytest.mark.runtime
def test_a_member_that_abandons_before_the_norm_exchange_releases_the_others() -> None:
    [outcome] = gloo_pair(_norm_exchange)
    assert outcome.startswith("aborted after") and float(outcome.split()[2].rstrip("s:")) < 5, outcome


def _dropout_config(p: float = 0.3, **kw) -> JobConfig:
    kw = {"steps": 4, **kw}
    config = JobConfig(model=ModelSpec(kind="py", path="tests.runtime._essentials_models:dropout_mlp",
                                       loss=f"{M}:huber", args={"p": p}),
                       data=DataSpec(source=f"py:{M}:regression"), dp=2, pp=2, microbatches=2, global_batch=8,
                       op_timeout_s=2.0, heartbeat_timeout_s=4.0, **kw)
    validate_model(config, profile=False).record(config)
    return config


def test_dropout_random_state_is_derived_not_global() -> None:
    from runtime.models.rng import layer_rng, layer_seed

    assert len({layer_seed(0, s, m, i) for s in range(3) for m in range(3) for i in range(3)}) == 27
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with layer_rng(0, 1, 2, 3):
        inside = torch.rand(3)
    assert torch.equal(torch.rand(3), expected)  # the global stream is untouched
    with layer_rng(0, 1, 2, 3):
        assert torch.equal(torch.rand(3), inside)  # the same (seed, step, micro-batch, layer): the same draw
    a, b = reference_run(_dropout_config()), reference_run(_dropout_config())
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    plain = reference_run(_dropout_config(p=0.0))
    assert a.losses != plain.losses  # dropout is active in training


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("strategy", "fault"), [("recycle", "kill"), ("bamboo", "notice"), ("oobleck", "kill")])
def test_dropout_under_failures_equals_the_reference(strategy: str, fault: str) -> None:
    config = _dropout_config(strategy=strategy, schedule="fiw" if strategy == "recycle" else "1f1b")
    result = run_local(config, faults=[Fault(node=1, kind=fault, step=1)], timeout_s=100)
    assert result.exit_codes[1] == (-9 if fault == "kill" else 0), result.exit_codes
    assert_same_math(result, config)


def test_recompute_is_the_same_math_in_the_reference() -> None:
    for config, other in ((_dropout_config(), _dropout_config(recompute=True)),
                          (small_config(model=ModelSpec(kind="gpt", n_layer=2)),
                           small_config(model=ModelSpec(kind="gpt", n_layer=2), recompute=True))):
        a, b = reference_run(config), reference_run(other)
        assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    try:
        reference_run(_dropout_config(steps=1))
        once = len(calls)
        calls.clear()
        reference_run(_dropout_config(steps=1, recompute=True))
    finally:
        handle.remove()
    assert len(calls) > once  # the forwards ran again in the backward


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("strategy", "schedule", "fault", "model"), [
    ("recycle", "fiw", "kill", "dropout"), ("bamboo", "1f1b", "notice", "dropout"), ("recycle", "fiw", "kill", "gpt"),
])
def test_recompute_under_failures_equals_the_reference(strategy: str, schedule: str, fault: str, model: str) -> None:
    gpt = ModelSpec(kind="gpt", n_layer=2)
    config = (_dropout_config(strategy=strategy, schedule=schedule, recompute=True) if model == "dropout" else
              small_config(strategy=strategy, schedule=schedule, recompute=True, model=gpt))
    result = run_local(config, faults=[Fault(node=1, kind=fault, step=1)], timeout_s=100)
    assert result.exit_codes[1] == (-9 if fault == "kill" else 0), result.exit_codes
    assert_same_math(result, config)


def test_validation_runs_in_eval_mode_without_dropout() -> None:
    # The same trained weights score the same held-out loss whatever the dropout rate: validation
    # measures the model, not a draw of its masks (train mode is restored after the pass).
    from runtime.data.dataset import Batches
    from runtime.models.model import build_layer
    from runtime.train.reference import validation_loss

    losses = []
    for p in (0.0, 0.9):
        config = _dropout_config(p=p, val_every=2)
        layers = [build_layer(config.model, i, config.seed) for i in range(config.model.num_layers)]
        losses.append(validation_loss(config, layers, Batches(config)))
        assert all(layer.training for layer in layers)
    assert losses[0] == losses[1]
    assert reference_run(_dropout_config(p=0.3, val_every=2)).val_losses  # and the reference validates


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_validation_with_dropout_under_a_kill_equals_the_reference() -> None:
    from runtime.train.reference import reference_run as run

    config = _dropout_config(strategy="recycle", schedule="fiw", val_every=2)
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=1)], timeout_s=100)
    expected = run(config).val_losses
    got = {r["step"]: r["val_loss"] for r in result.steps() if "val_loss" in r}
    assert sorted(got) == sorted(expected) == [1, 3]
    for step, value in got.items():
        torch.testing.assert_close(value, expected[step])
