"""Your own model: user models unlike the GPT (a CNN classifier returned whole, a residual MLP with
LayerNorm as layer factories with a custom loss) trained through `spotpipe train` with dp=2, pp=2
under every fault-tolerant strategy with a rank killed and with a notice, ending with the parameters
of the failure-free single-process run; and every validation failure is one message, before any
process starts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.models.usermodel import ModelError, boundary_shapes, build_user_layer
from runtime.train.model_check import validate_model
from runtime.train.reference import train_reference
from spotpipe.train import TrainOptions, run_train

M = "tests.usermodels.models"
CNN = dict(model=f"{M}:cnn", model_args='{"channels": 4}', data=f"py:{M}:images")
RESMLP_FILE = f"""target_steps = 4
[config]
global_batch = 8
op_timeout_s = 2.0
heartbeat_timeout_s = 4.0
lr = 0.01
[config.data]
source = "py:{M}:regression"
[config.model]
kind = "py"
path = "{M}:resmlp"
loss = "{M}:huber"
args = {{ width = 16, blocks = 2 }}
[plan]
dp = 2
pp = 2
microbatches = 2
"""


def _train(**options) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run_train(TrainOptions(**options), out=out, err=err), out.getvalue(), err.getvalue()


def _rank_params(ranks: Path) -> dict[str, list[torch.Tensor]]:
    params: dict[str, list[torch.Tensor]] = {}
    for path in sorted(ranks.glob("node-*.pt")):
        for name, value in torch.load(path)["params"].items():
            params.setdefault(name, []).append(value)
    return params


def assert_reference(out_dir: Path) -> None:
    """The ranks' final parameters (every copy) equal the single-process run of the resolved config."""
    config = JobConfig.from_dict(json.loads((out_dir / "spotpipe.json").read_text())["config"])
    reference, _ = train_reference(config)
    params = _rank_params(out_dir / "ranks")
    assert set(params) == set(reference), "the finished ranks do not hold the whole model"
    for name, expected in reference.items():
        for value in params[name]:
            torch.testing.assert_close(value, expected, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.runtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["kill", "notice"])
@pytest.mark.parametrize("strategy", ["recycle", "bamboo", "oobleck", "checkpoint"])
@pytest.mark.parametrize("model", ["cnn", "resmlp"])
def test_user_model_same_math_under_failures(tmp_path: Path, model: str, strategy: str, kind: str) -> None:
    out_dir = tmp_path / "out"
    if model == "cnn":
        options = dict(**CNN, dp=2, pp=2, microbatches=2, global_batch=8, steps=4, lr=0.01)
    else:
        (tmp_path / "job.toml").write_text(RESMLP_FILE)
        options = dict(file=tmp_path / "job.toml")
    code, out, err = _train(**options, strategy=strategy, fails=[f"{kind}:1@2"], out=out_dir)
    assert code == 0, err
    summary = json.loads((out_dir / "spotpipe.json").read_text())
    assert summary["config"]["model"]["layers"] == 4 and len(summary["config"]["layer_costs"]) == 4
    assert f"training {M}:{model} (4 layers)" in out
    # Not token windows: throughput in samples, never labelled tokens.
    assert "samples/s" in out and "tok/s" not in out
    told = "lost rank 1" if kind == "kill" else "rank 1 left on notice"
    assert f"recovery: generation 1: {told}" in out, out
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert all("samples_per_s" in r and "tokens_per_s" not in r for r in records)
    assert len(list((out_dir / "ranks").glob("node-*.pt"))) == 3  # rank 1 was killed or left: it saved nothing
    assert_reference(out_dir)
    assert_loaded_model_is_the_reference(out_dir)


@pytest.mark.runtime
@pytest.mark.timeout(180)
def test_a_model_with_a_non_persistent_buffer_and_tied_weights_loads_and_runs(tmp_path: Path) -> None:
    """The mask is not in the weights: `load_model` builds that layer for real (as the nodes do)
    instead of leaving it on the meta device, and keeps its tied projections tied."""
    out_dir = tmp_path / "out"
    code, _out, err = _train(model=f"{M}:causal_lm", data=f"py:{M}:counting", dp=1, pp=3, microbatches=2,
                             global_batch=8, steps=3, lr=0.01, out=out_dir)
    assert code == 0, err
    assert_loaded_model_is_the_reference(out_dir)
    import spotpipe

    mixing = spotpipe.load_model(out_dir)[1]
    assert not mixing.mask.is_meta and bool(mixing.mask[0, 1]) is False
    assert mixing.up.weight is mixing.down.weight


@pytest.mark.runtime
@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["recycle", "bamboo", "oobleck", "checkpoint"])
def test_layers_without_parameters_join_a_neighbours_stage_and_keep_the_math(tmp_path: Path, strategy: str) -> None:
    """Identity, ReLU and Tanh layers (first, inside, last) are accepted at any pp: each joins the
    stage of the next layer with parameters (the last ones: the previous), so every stage has
    parameters to train; a kill keeps the math and the weights load into the user's own model."""
    out_dir = tmp_path / "out"
    (tmp_path / "job.toml").write_text(RESMLP_FILE.replace(":resmlp", ":parameterless").replace("pp = 2", "pp = 3")
                                       .replace("args = { width = 16, blocks = 2 }\n", ""))
    code, _out, err = _train(file=tmp_path / "job.toml", strategy=strategy, fails=["kill:1@2"], out=out_dir)
    assert code == 0, err
    summary = json.loads((out_dir / "spotpipe.json").read_text())
    measures = summary["config"]["model"]["layer_measures"]
    assert [m["parameters"] for m in measures] == [0, 112, 0, 272, 0, 34, 0]
    config = JobConfig.from_dict(summary["config"])
    from runtime.strategies import initial_layout

    assert initial_layout(config).stages == ((0, 2), (2, 4), (4, 7))
    assert_reference(out_dir)
    assert_loaded_model_is_the_reference(out_dir)
    from safetensors.torch import load_file

    from tests.usermodels.models import parameterless

    weights = {k: v for shard in sorted(out_dir.glob("model*.safetensors")) for k, v in load_file(shard).items()}
    parameterless().load_state_dict(weights, strict=True)  # the user's own nn.Sequential takes them


def assert_loaded_model_is_the_reference(out_dir: Path) -> None:
    """`spotpipe.load_model` on the run's folder gives a module whose forward equals the reference
    model's (trained in one process) on the same input."""
    import spotpipe
    from runtime.data.dataset import Batches
    from runtime.models.model import build_model

    config = JobConfig.from_dict(json.loads((out_dir / "spotpipe.json").read_text())["config"])
    reference, _ = train_reference(config)
    expected = build_model(config.model, config.seed)
    # The reference names each parameter once: a tied alias is the only key it may leave out.
    missing, unexpected = expected.load_state_dict(
        {f"{k.split('.', 1)[0].removeprefix('layer')}.{k.split('.', 1)[1]}": v for k, v in reference.items()},
        strict=False)
    named = dict(expected.named_parameters())
    assert not unexpected and all(k not in named for k in missing), (missing, unexpected)
    loaded = spotpipe.load_model(out_dir)
    x, _ = Batches(config).val(batch=0, index=0, size=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected.eval()(x))


def test_boundaries_change_shape_and_init_is_the_same_on_every_rank() -> None:
    config = JobConfig(model=ModelSpec(kind="py", path=f"{M}:cnn", args={"channels": 4}, layers=4), dp=1, pp=4,
                       microbatches=1, global_batch=2)
    shapes = boundary_shapes(config, torch.zeros(2, 1, 8, 8))
    assert [s for s, _ in shapes] == [(2, 1, 8, 8), (2, 4, 8, 8), (2, 8, 4, 4), (2, 16)]
    assert all(d == torch.float32 for _, d in shapes)
    # a layer built again (a survivor or a replacement) equals the original; factories too
    for path in (f"{M}:cnn", f"{M}:resmlp"):
        spec = ModelSpec(kind="py", path=path, layers=4)
        first, again = build_user_layer(spec, 2, seed=5), build_user_layer(spec, 2, seed=5)
        for a, b in zip(first.parameters(), again.parameters(), strict=True):
            assert torch.equal(a, b)
        other = build_user_layer(spec, 2, seed=6)
        assert not all(torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters(), strict=True))


def test_a_factory_layer_is_built_alone() -> None:
    """Layer factories: building layer 3 alone gives the layer of a whole build (seeded per index)."""
    spec = ModelSpec(kind="py", path=f"{M}:resmlp", layers=4)
    whole = [build_user_layer(spec, i, seed=0) for i in range(4)]
    torch.manual_seed(123)  # the global generator's state does not matter
    alone = build_user_layer(spec, 3, seed=0)
    for a, b in zip(whole[3].parameters(), alone.parameters(), strict=True):
        assert torch.equal(a, b)


BAD = [
    (dict(model="nosuchpkg.models:net"), "model.path: model.path 'nosuchpkg.models:net': importing 'nosuchpkg.models' "
                                          "failed (ModuleNotFoundError: No module named 'nosuchpkg')"),
    (dict(model=f"{M}:nothing"), f"module '{M}' has no model function 'nothing'"),
    (dict(model=f"{M}:returns_dict"), f"model function {M}:returns_dict returned dict; expected an nn.Sequential"),
    (dict(model=f"{M}:mixed"), f"model function {M}:mixed returned a list of Linear, str; expected"),
    (dict(model=f"{M}:two_layers", pp=4), f"model function {M}:two_layers returns 2 layers, fewer than the pp=4 "
                                          "pipeline stages; expected at least 4 layers"),
    (dict(model=f"{M}:mismatched"), "layer 2 (Linear) cannot take the output of layer 1 (Linear), a tensor of shape "
                                    "(2, 16) (float32): RuntimeError"),
    (dict(model=f"{M}:no_parameters"), f"model function {M}:no_parameters returns 2 layers and none holds "
                                        "parameters; expected at least one layer with parameters to train"),
    (dict(model=f"{M}:parameterless", pp=4), f"model function {M}:parameterless returns 7 layers of which 3 hold "
                                             "parameters, fewer than the pp=4 pipeline stages"),
    (dict(model=f"{M}:nondeterministic"), "layer 0 (Linear) is initialised non-deterministically: layer factory 0 run "
                                          "twice under torch.manual_seed(0) gave different values of 'weight'"),
    (dict(model=f"{M}:resmlp"), "model.loss: the loss (cross-entropy) cannot take the last layer's output"),
    (dict(model=f"{M}:resmlp", loss=f"{M}:bad_loss"), "the loss (tests.usermodels.models:bad_loss) returns a tensor of "
                                                      "shape (2, 2) (float32); expected a scalar tensor"),
    (dict(model=f"{M}:resmlp", loss=f"{M}:absent"), "module 'tests.usermodels.models' has no loss function 'absent'"),
    (dict(model=f"{M}:resmlp", model_args="[1]"), "--model-args '[1]' is a JSON list; expected a JSON object"),
    (dict(model=f"{M}:resmlp", model_args='{"width": 16, "depth": 3}'),
     "resmlp(**{\"width\": 16, \"depth\": 3}) raised TypeError"),
    (dict(model="gpt-nano", model_args="{}"), "--model-args is for a model function"),
    (dict(model="not a path:x"), "model.path 'not a path:x' is invalid; expected the model function as "
                                 "package.module:function"),
]


@pytest.mark.parametrize(("options", "message"), BAD)
def test_bad_model_is_one_message_and_starts_nothing(tmp_path: Path, options: dict, message: str) -> None:
    loss = options.pop("loss", None)
    out_dir = tmp_path / "out"
    if loss:  # the job file's model (a --model flag would replace it, loss and all)
        options.pop("model")
        (tmp_path / "job.toml").write_text(RESMLP_FILE.replace(f'loss = "{M}:huber"', f'loss = "{loss}"'))
        options = dict(file=tmp_path / "job.toml", **options)
    else:
        options = dict(data=f"py:{M}:regression", dp=1, pp=options.pop("pp", 2), global_batch=8, **options)
    code, _, err = _train(**options, out=out_dir)
    assert code == 2, err
    assert message in err, err
    assert err.count("error:") == 1, err
    assert not (out_dir / "ranks").exists()  # no rank was started


def test_a_last_layer_narrower_than_the_vocabulary_or_the_classes_is_refused_before_anything_runs(
        tmp_path: Path) -> None:
    """The default cross-entropy indexes the last layer's output by the targets, which the dry
    forward on the meta device does not bound-check: checked here, naming the model and both numbers."""
    from tests.runtime.test_train_command import CORPUS

    code, _, err = _train(model=f"{M}:narrow_lm", data=f"text:{CORPUS}", global_batch=4, steps=2,
                          out=tmp_path / "lm")
    assert code == 2 and err.count("error:") == 1, err
    assert (f"error: model.vocab_size: model function {M}:narrow_lm: its last layer, layer 2 (Linear), outputs 10 "
            "values per position, but the model's vocab_size is 256; expected logits over the vocabulary") in err
    code, _, err = _train(**{**CNN, "model_args": '{"channels": 4, "classes": 1}'}, global_batch=8, steps=2,
                          out=tmp_path / "cnn")
    assert code == 2 and err.count("error:") == 1, err
    assert f"model function {M}:cnn: its last layer, layer 3 (Linear), outputs 1 values in its last dimension, " \
           "but the data's targets go up to " in err  # (the largest of the micro-batch checked)
    assert not (tmp_path / "lm").exists() and not (tmp_path / "cnn").exists()  # nothing started, nothing written


@pytest.mark.parametrize(("args", "message"), [
    ("x", "model.args must be a JSON object"),
    ({"a": float("nan")}, "model.args.a must be a finite number"),
    ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}, "nested more than 8 levels deep"),
    ({"a": "x" * 70_000}, "expected at most 65,536"),
])
def test_model_args_are_checked_by_the_contract(args: object, message: str) -> None:
    with pytest.raises(LayoutError, match=r"model\.args") as info:
        JobConfig.from_dict({"model": {"kind": "py", "path": f"{M}:cnn", "args": args}})
    assert message in str(info.value)


def test_contract_fields_of_a_user_model() -> None:
    config = JobConfig.from_dict({"model": {"kind": "py", "path": f"{M}:cnn", "args": {"channels": 2}}, "pp": 8})
    config.validate()  # layers unknown until validated: pp is checked then
    config.model.layers = 4
    with pytest.raises(LayoutError, match=rf"pp=8 stages but the model function {M}:cnn returns only 4 layers"):
        config.validate()
    with pytest.raises(LayoutError, match=r"model\.path is for a user's model"):
        JobConfig.from_dict({"model": {"kind": "gpt", "path": f"{M}:cnn"}}).validate()
    assert JobConfig.from_dict(config.to_dict()) == config  # round-trips through JSON


def test_validate_model_records_layers_and_costs() -> None:
    config = JobConfig(model=ModelSpec(kind="py", path=f"{M}:cnn"), dp=1, pp=2, microbatches=1, global_batch=4,
                       data=__import__("runtime.config").config.DataSpec(source=f"py:{M}:images"))
    report = validate_model(config)
    assert report.num_layers == 4 and len(report.layer_costs) == 4 and all(c > 0 for c in report.layer_costs)
    assert report.boundaries[2] == ((4, 8, 4, 4), torch.float32)
    report.record(config)
    assert config.model.layers == 4 and config.layer_costs == report.layer_costs
    assert [m.parameters for m in config.model.layer_measures] == report.parameters
    assert config.model.layer_measures[0].input_grad is False and config.model.layer_measures[1].input_grad
    with pytest.raises(ModelError, match=r"returns 4 layers but the job's contract says model\.layers=5"):
        config.model.layers, config.model.layer_measures = 5, []  # a contract of another version of the code
        validate_model(config, profile=False)


def test_submit_validates_here_and_sends_layers_and_costs(tmp_path: Path, submitted: list[dict]) -> None:
    from spotpipe import commands

    sent = submitted
    (tmp_path / "job.toml").write_text(RESMLP_FILE)
    assert commands.submit(tmp_path / "job.toml") == 0
    assert sent[0]["config"]["model"]["layers"] == 4 and len(sent[0]["config"]["layer_costs"]) == 4
    measures = sent[0]["config"]["model"]["layer_measures"]
    assert len(measures) == 4 and all(m["parameters"] > 0 and m["forward_flops"] > 0 for m in measures)
    (tmp_path / "bad.toml").write_text(RESMLP_FILE.replace(":resmlp", ":no_parameters")
                                          .replace("args = { width = 16, blocks = 2 }\n", ""))
    err = io.StringIO()
    assert commands.submit(tmp_path / "bad.toml", err=err) == 2
    assert "none holds parameters" in err.getvalue() and len(sent) == 1  # nothing sent


@pytest.mark.runtime
@pytest.mark.timeout(300)
def test_a_user_language_model_declares_its_context_trains_on_text_and_samples(tmp_path: Path) -> None:
    """One model contract: the function's declaration sets the data's windows (its arguments change
    them), spotpipe.json holds only the fields of its kind, tokens are counted, and it samples."""
    from tests.runtime.test_train_command import CORPUS

    out_dir = tmp_path / "out"
    code, out, err = _train(model=f"{M}:byte_lm", model_args='{"context": 24}', data=f"text:{CORPUS}", pp=3,
                            microbatches=2, global_batch=8, steps=3, lr=0.01, out=out_dir)
    assert code == 0, err
    entry = json.loads((out_dir / "spotpipe.json").read_text())["model"]
    assert (entry["seq_len"], entry["vocab_size"], entry["layers"]) == (24, 256, 3)
    assert not {"n_layer", "n_embd", "n_head", "in_features"} & set(entry), entry
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 24) for r in records) and "tok/s" in out

    from spotpipe.sample import run_sample

    sampled, problems = io.StringIO(), io.StringIO()
    assert run_sample(str(out_dir), prompt="def ", tokens=6, top_k=5, out=sampled, err=problems) == 0, \
        problems.getvalue()
    assert sampled.getvalue().startswith("def ")


@pytest.mark.parametrize(("options", "message"), [
    # Token windows of an undeclared length: refused, never a silent default.
    (dict(model=f"{M}:causal_lm"),
     ["model.seq_len: model.seq_len is not declared for tests.usermodels.models:causal_lm",
      "model.vocab_size: model.vocab_size is not declared"]),
    (dict(model=f"{M}:byte_lm", seq_len=16),
     ["model.seq_len=16 is set for the job, but the model function tests.usermodels.models:byte_lm declares "
      "seq_len=32; expected one value"]),
    (dict(model=f"{M}:causal_lm", vocab_size=64), ["--vocab-size 64 is below the tokenizer's 256 ids"]),
])
def test_an_undeclared_or_contradicted_context_is_refused_before_anything_runs(
        tmp_path: Path, options: dict, message: list[str]) -> None:
    from tests.runtime.test_train_command import CORPUS

    code, _, err = _train(**options, data=f"text:{CORPUS}", out=tmp_path / "out")
    assert code == 2 and all(m in err for m in message), err
    assert not (tmp_path / "out" / "ranks").exists()


@pytest.mark.runtime
@pytest.mark.timeout(300)
def test_the_flags_declare_a_model_functions_context_and_sample_refuses_what_is_not_a_language_model(
        tmp_path: Path) -> None:
    from tests.runtime.test_train_command import CORPUS

    out_dir = tmp_path / "flags"
    code, _, err = _train(model=f"{M}:causal_lm", model_args='{"vocab": 256, "context": 16}', seq_len=16,
                          vocab_size=256, data=f"text:{CORPUS}", global_batch=4, steps=2, out=out_dir)
    assert code == 0, err
    assert json.loads((out_dir / "spotpipe.json").read_text())["model"]["seq_len"] == 16

    tagger = tmp_path / "tagger"
    code, _, err = _train(model=f"{M}:lm_said_not", data=f"text:{CORPUS}", global_batch=4, steps=2, out=tagger)
    assert code == 0, err
    from spotpipe.sample import run_sample

    problems = io.StringIO()
    assert run_sample(str(tagger), tokens=3, out=io.StringIO(), err=problems) == 2
    assert "is not a language model" in problems.getvalue()
