"""`init_from` a local Hugging Face GPT-2 folder (issue 19): the names and shapes of transformers'
GPT2LMHeadModel mapped onto the built-in GPT, checked against the job's model, and the logits equal
to GPT-2's computation on those weights.

transformers is not a dependency, so the folder is written here by hand as `save_pretrained` writes
it (see runtime/models/hf_gpt2.py for the conventions relied on): `config.json` with model_type gpt2 and
the shape fields, `model.safetensors` with `transformer.`-prefixed keys, Conv1D weights stored
(in, out), no `lm_head.weight` (tied to wte), and the attention-mask buffers older files carry. The
expected logits come from `gpt2_forward` below: GPT-2's forward written from those tensors alone
(Conv1D as x @ W + b, "gelu_new", LayerNorm eps 1e-5, masked softmax scaled by 1/sqrt(head size)).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from runtime.checkpointing.export import ExportError
from runtime.config import JobConfig, ModelSpec
from runtime.data.dataset import microbatch_data
from runtime.models.load import initial_state
from runtime.models.model import build_layer, loss_fn
from runtime.train.launcher import run_local
from runtime.train.optim import LayerState

HF = {"model_type": "gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 32, "vocab_size": 64,
      "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "n_inner": None}
SPEC = ModelSpec(kind="gpt", n_layer=2, n_embd=16, n_head=2, seq_len=16, vocab_size=64)


def hf_state(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A GPT2LMHeadModel state dict as transformers saves it (tied head left out), random values."""
    gen = torch.Generator().manual_seed(seed)
    C, V = config["n_embd"], config["vocab_size"]

    def r(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    state = {"transformer.wte.weight": r(V, C), "transformer.wpe.weight": r(config["n_positions"], C),
             "transformer.ln_f.weight": 1 + r(C), "transformer.ln_f.bias": r(C)}
    for i in range(config["n_layer"]):
        h = f"transformer.h.{i}."
        state.update({
            h + "ln_1.weight": 1 + r(C), h + "ln_1.bias": r(C), h + "ln_2.weight": 1 + r(C), h + "ln_2.bias": r(C),
            h + "attn.c_attn.weight": r(C, 3 * C), h + "attn.c_attn.bias": r(3 * C),  # Conv1D: (in, out)
            h + "attn.c_proj.weight": r(C, C), h + "attn.c_proj.bias": r(C),
            h + "mlp.c_fc.weight": r(C, 4 * C), h + "mlp.c_fc.bias": r(4 * C),
            h + "mlp.c_proj.weight": r(4 * C, C), h + "mlp.c_proj.bias": r(C),
            h + "attn.bias": torch.tril(torch.ones(config["n_positions"], config["n_positions"]))[None, None],
        })
    return state


def write_hf_folder(directory: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], **config}))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def gpt2_forward(state: dict[str, torch.Tensor], config: dict, idx: torch.Tensor) -> torch.Tensor:
    """GPT-2's logits from the Hugging Face tensors alone (transformers' GPT2LMHeadModel, eval mode)."""
    B, T = idx.shape
    C, nh = config["n_embd"], config["n_head"]
    s = {k.removeprefix("transformer."): v for k, v in state.items()}

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + 1e-5) * s[f"{name}.weight"] + s[f"{name}.bias"]

    def conv1d(x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ s[f"{name}.weight"] + s[f"{name}.bias"]

    def gelu_new(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    x = s["wte.weight"][idx] + s["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(config["n_layer"]):
        h = f"h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(C // nh)
        y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + conv1d(y.transpose(1, 2).reshape(B, T, C), h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    return ln(x, "ln_f") @ s["wte.weight"].T  # the tied head


def _loaded_model(directory: Path, spec: ModelSpec) -> torch.nn.Sequential:
    init = initial_state(str(directory), spec)
    layers = []
    for i in range(spec.num_layers):
        state = LayerState(i, build_layer(spec, i, seed=7))
        init.apply(state)
        layers.append(state.module)
    assert init.start_step == 0 and init.optimizer is None  # weights only
    return torch.nn.Sequential(*layers).eval()


def test_hf_gpt2_folder_gives_gpt2s_logits(tmp_path: Path) -> None:
    state = hf_state(HF)
    folder = write_hf_folder(tmp_path / "hf", HF, state)
    model = _loaded_model(folder, SPEC)
    idx = torch.randint(0, HF["vocab_size"], (3, SPEC.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(idx), gpt2_forward(state, HF, idx)
    # The same computation; only float32 rounding differs (fused SDPA and nn.LayerNorm vs the
    # explicit formulas): measured max |difference| about 1e-6 on logits of magnitude about 3.
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert theirs.abs().max() > 1  # not a comparison of near-zeros
    head = model[SPEC.num_layers - 1].lm_head.weight
    assert torch.equal(head, state["transformer.wte.weight"])  # the untied head starts from wte
    assert head.data_ptr() != model[0].wte.weight.data_ptr()


def test_bare_gpt2model_keys_and_an_untied_head_load(tmp_path: Path) -> None:
    state = {k.removeprefix("transformer."): v for k, v in hf_state(HF).items()}
    state["lm_head.weight"] = torch.randn(HF["vocab_size"], HF["n_embd"])
    model = _loaded_model(write_hf_folder(tmp_path / "hf", HF, state), SPEC)
    assert torch.equal(model[SPEC.num_layers - 1].lm_head.weight, state["lm_head.weight"])
    assert torch.equal(model[1].c_attn.weight, state["h.0.attn.c_attn.weight"].T)  # Conv1D transposed


@pytest.mark.parametrize(("change", "named"), [
    ({"vocab_size": 256}, "vocab_size is 64; the job's model.vocab_size is 256 (the job's vocabulary must be"),
    ({"n_layer": 3}, "n_layer is 2; the job's model.n_layer is 3"),
    ({"n_head": 4}, "n_head is 2; the job's model.n_head is 4"),
    ({"seq_len": 64}, "n_positions is 32; the job's model.seq_len is 64"),
])
def test_a_model_that_does_not_fit_is_named_in_one_message(tmp_path: Path, change: dict, named: str) -> None:
    folder = write_hf_folder(tmp_path / "hf", HF, hf_state(HF))
    spec = _spec(**change)
    with pytest.raises(ExportError, match="is a Hugging Face GPT-2 that does not fit") as info:
        initial_state(str(folder), spec)
    assert named in str(info.value)


def test_other_gpt2_variants_are_refused_by_name(tmp_path: Path) -> None:
    folder = write_hf_folder(tmp_path / "hf", {**HF, "activation_function": "relu", "layer_norm_epsilon": 1e-6},
                             hf_state(HF))
    with pytest.raises(ExportError) as info:
        initial_state(str(folder), SPEC)
    assert "activation_function is 'relu'" in str(info.value) and "layer_norm_epsilon is 1e-06" in str(info.value)


def _spec(**change: int) -> ModelSpec:
    fields = {name: getattr(SPEC, name) for name in ("kind", "n_layer", "n_embd", "n_head", "seq_len", "vocab_size")}
    return ModelSpec(**{**fields, **change})


@pytest.mark.runtime
@pytest.mark.timeout(60)
def test_workers_start_from_the_hf_weights(tmp_path: Path) -> None:
    """The job field `init_from` through real workers (pp=2): the first step's loss is GPT-2's."""
    state = hf_state(HF)
    folder = write_hf_folder(tmp_path / "hf", HF, state)
    config = JobConfig(model=SPEC, dp=1, pp=2, microbatches=2, global_batch=4, steps=1, strategy="none",
                       init_from=str(folder), op_timeout_s=2.0, heartbeat_timeout_s=4.0)
    result = run_local(config, timeout_s=50)
    assert all(code == 0 for code in result.exit_codes.values()), result.exit_codes
    expected = []
    for mb in range(config.num_microbatches):
        x, y = microbatch_data(SPEC, seed=config.seed, step=0, index=mb, size=config.microbatch_size)
        expected.append(float(loss_fn(gpt2_forward(state, HF, x), y)))
    [record] = [r for r in result.steps() if "loss" in r and r["step"] == 0][:1]
    assert record["loss"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)


def test_spotpipe_train_names_the_mismatch_before_any_rank_starts(tmp_path: Path) -> None:
    import io

    from spotpipe.train import TrainOptions, run_train

    folder = write_hf_folder(tmp_path / "hf", HF, hf_state(HF))
    out, err = io.StringIO(), io.StringIO()
    code = run_train(TrainOptions(model="gpt-nano", init_from=str(folder), out=tmp_path / "out"), out=out, err=err)
    assert code == 2
    assert err.getvalue().startswith("error: init_from: ") and "its vocab_size is 64; the job's model.vocab_size is " \
        "256 (the job's vocabulary must be the checkpoint's" in err.getvalue(), err.getvalue()
    assert "n_layer is 2; the job's model.n_layer is 4" in err.getvalue()  # every mismatch, one message
    assert not (tmp_path / "out" / "ranks").exists()  # no rank started
