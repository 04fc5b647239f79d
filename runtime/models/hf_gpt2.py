"""Hugging Face GPT-2 weights as the starting point of a built-in GPT (`init_from` a local folder that
`transformers` wrote with `GPT2LMHeadModel.save_pretrained`): the one owner of the name mapping.

What this relies on in such a folder (transformers' GPT-2, unchanged since its first release):

- `config.json` with `model_type` "gpt2" and the shape fields `n_layer`, `n_embd`, `n_head`,
  `n_positions`, `vocab_size` (also `activation_function`, default "gelu_new" (GELU, tanh
  approximation), `layer_norm_epsilon`, default 1e-5, `n_inner`, default 4 * n_embd);
- `model.safetensors` (or `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`) with
  keys `transformer.wte.weight` (vocab, C), `transformer.wpe.weight` (n_positions, C),
  `transformer.h.{i}.ln_1.{weight,bias}`, `.attn.c_attn.{weight,bias}`, `.attn.c_proj.*`, `.ln_2.*`,
  `.mlp.c_fc.*`, `.mlp.c_proj.*`, `transformer.ln_f.*` and, only when untied, `lm_head.weight`
  (GPT-2 ties it to `wte`, and transformers then leaves it out of the file). A bare `GPT2Model`
  folder has the same keys without `transformer.`; older files also hold the attention mask buffers
  (`attn.bias`, `attn.masked_bias`), which are not weights and are ignored;
- the projections are `Conv1D`s, whose weight is (in, out): the transpose of `nn.Linear`'s (out, in);
  `c_attn`'s output is q, k, v in that order, C each, heads in order inside each.

Our GPT (`runtime.models.model`) is GPT-2's computation: pre-norm blocks, LayerNorm eps 1e-5, one biased qkv
projection, attention scaled by 1/sqrt(head size), GELU with the tanh approximation, final LayerNorm,
a bias-free head. It differs in two ways that change no output of a loaded model: the head is its own
parameter (initialised here from `wte`, then trained apart from it), and there is no dropout (GPT-2's
0.1 applies in training only). `wpe` keeps the job's `seq_len` first positions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from runtime.checkpointing.export import INFO, ExportError, WeightsFolder
from runtime.config import ModelSpec
from runtime.models.hf_layout import CONFIG

MODEL_TYPE = "gpt2"
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
"""transformers' names of GELU with the tanh approximation (what our blocks compute)."""
SHAPE_FIELDS = (("n_layer", "n_layer"), ("n_embd", "n_embd"), ("n_head", "n_head"), ("vocab_size", "vocab_size"))
"""(config.json field, ModelSpec field) that must be equal."""


class HFWeightsError(ExportError):
    """A Hugging Face folder that does not fit the job's model; the message names the field."""


def is_hf_gpt2(directory: str | Path) -> bool:
    """A Hugging Face GPT-2 folder: config.json with model_type gpt2, and no spotpipe.json (ours)."""
    d = Path(directory)
    if (d / INFO).is_file() or not (d / CONFIG).is_file():
        return False
    try:
        return json.loads((d / CONFIG).read_text()).get("model_type") == MODEL_TYPE
    except (ValueError, AttributeError):
        return False


def read_config(directory: str | Path) -> dict[str, Any]:
    """The folder's config.json."""
    return json.loads((Path(directory) / CONFIG).read_text())


def config_problems(hf: dict[str, Any], spec: ModelSpec) -> list[str]:
    """Why the checkpoint of config.json `hf` cannot start the job's model `spec` (empty: it can)."""
    if spec.kind != "gpt":
        return [f"it is a GPT-2; the job's model.kind is {spec.kind!r} (expected 'gpt': a gpt2 preset)"]
    found = []
    for theirs, ours in SHAPE_FIELDS:
        if hf.get(theirs) != getattr(spec, ours):
            found.append(f"its {theirs} is {hf.get(theirs)}; the job's model.{ours} is {getattr(spec, ours)}"
                         + (_VOCAB_HINT if ours == "vocab_size" else ""))
    if not isinstance(hf.get("n_positions"), int) or hf["n_positions"] < spec.seq_len:
        found.append(f"its n_positions is {hf.get('n_positions')}; the job's model.seq_len is {spec.seq_len} "
                     f"(expected seq_len <= n_positions)")
    if hf.get("activation_function", "gelu_new") not in TANH_GELUS:
        found.append(f"its activation_function is {hf['activation_function']!r}; ours is GELU with the tanh "
                     f"approximation (expected one of {TANH_GELUS})")
    if hf.get("layer_norm_epsilon", 1e-5) != 1e-5:
        found.append(f"its layer_norm_epsilon is {hf['layer_norm_epsilon']}; ours is 1e-5")
    if hf.get("n_inner") not in (None, 4 * spec.n_embd):
        found.append(f"its n_inner is {hf['n_inner']}; ours is 4 * n_embd = {4 * spec.n_embd}")
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
        found.append("its attention scaling is not GPT-2's 1/sqrt(head size) (scale_attn_by_inverse_layer_idx "
                     "or scale_attn_weights=false)")
    return found


_VOCAB_HINT = (" (the job's vocabulary must be the checkpoint's: train with its tokenizer, --tokenizer "
               "DIR/tokenizer.json (data.tokenizer), so a gpt2 preset gets its vocabulary)")


Transform = Callable[[torch.Tensor], torch.Tensor]


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _transposed(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous()  # Conv1D (in, out) -> nn.Linear (out, in)


def key_map(spec: ModelSpec) -> dict[str, tuple[tuple[str, ...], Transform]]:
    """Our state-dict key -> (the Hugging Face names to try, in order, without `transformer.`; the
    transform to our shape)."""
    head = spec.n_layer + 1

    def keep_positions(t: torch.Tensor) -> torch.Tensor:
        return t[: spec.seq_len].contiguous()

    out: dict[str, tuple[tuple[str, ...], Transform]] = {
        "0.wte.weight": (("wte.weight",), _same),
        "0.wpe.weight": (("wpe.weight",), keep_positions),
        f"{head}.ln_f.weight": (("ln_f.weight",), _same),
        f"{head}.ln_f.bias": (("ln_f.bias",), _same),
        f"{head}.lm_head.weight": (("lm_head.weight", "wte.weight"), _same),  # tied in GPT-2: start from wte
    }
    blocks = {"ln_1": ("ln_1", _same), "c_attn": ("attn.c_attn", _transposed), "c_proj": ("attn.c_proj", _transposed),
              "ln_2": ("ln_2", _same), "mlp_fc": ("mlp.c_fc", _transposed), "mlp_proj": ("mlp.c_proj", _transposed)}
    for i in range(spec.n_layer):
        for ours, (theirs, weight_transform) in blocks.items():
            out[f"{i + 1}.{ours}.weight"] = ((f"h.{i}.{theirs}.weight",), weight_transform)
            out[f"{i + 1}.{ours}.bias"] = ((f"h.{i}.{theirs}.bias",), _same)
    return out


class HFGPT2Weights:
    """A Hugging Face GPT-2 folder read under our keys (an `InitialState`'s weights, `runtime.models.load`):
    checked against the job's model when opened, tensors mapped when read. Weights only: no
    optimizer state, so the job starts at step 0."""

    steps_done = 0

    def __init__(self, directory: str | Path, spec: ModelSpec) -> None:
        problems = config_problems(read_config(directory), spec)
        if problems:
            raise HFWeightsError(f"{directory} is a Hugging Face GPT-2 that does not fit the job's model: "
                                 + "; ".join(problems))
        self.directory = str(directory)
        self.folder = WeightsFolder(directory)  # the Hugging Face layout, sharded or not
        self.map = key_map(spec)

    def _their_name(self, names: tuple[str, ...]) -> str:
        for name in names:
            for full in (f"transformer.{name}", name):
                if full in self.folder.weight_map:
                    return full
        raise HFWeightsError(f"{self.directory}: the Hugging Face weights lack transformer.{names[0]}")

    def tensors(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """Our keys' tensors, in our shapes (float32, as our parameters)."""
        keys = list(keys)
        unknown = [k for k in keys if k not in self.map]
        if unknown:
            raise HFWeightsError(f"{self.directory}: a GPT-2 checkpoint has no counterpart of {unknown[:5]}")
        names = {key: self._their_name(self.map[key][0]) for key in keys}
        found = self.folder.tensors(set(names.values()))
        return {key: self.map[key][1](found[names[key]]).float() for key in keys}


# --- out: a Hugging Face GPT-2 folder of a trained gpt preset ----------------------------------------



def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """config.json of `spec` as a `GPT2LMHeadModel`: the same computation (see the module doc), the
    context as `n_positions`, the head untied (ours is trained apart from `wte`), no dropout."""
    return {
        "model_type": MODEL_TYPE, "architectures": ["GPT2LMHeadModel"], "n_layer": spec.n_layer,
        "n_embd": spec.n_embd, "n_head": spec.n_head, "n_positions": spec.seq_len, "n_ctx": spec.seq_len,
        "vocab_size": spec.vocab_size, "activation_function": TANH_GELUS[0], "layer_norm_epsilon": 1e-5,
        "n_inner": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True,
        "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32",
    }


def spec_of_hf(hf: dict[str, Any]) -> ModelSpec:
    """The built-in GPT a GPT-2 config.json describes (its context: `n_positions`)."""
    return ModelSpec(kind="gpt", n_layer=int(hf["n_layer"]), n_embd=int(hf["n_embd"]), n_head=int(hf["n_head"]),
                     vocab_size=int(hf["vocab_size"]), seq_len=int(hf["n_positions"]))


def hf_state(spec: ModelSpec, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict under GPT-2's names and layouts (`key_map` read backwards: Conv1D weights
    transposed back, `lm_head.weight` its own tensor)."""
    out = {}
    for ours, (names, transform) in key_map(spec).items():
        theirs = names[0] if names[0] == "lm_head.weight" else f"transformer.{names[0]}"
        tensor = state[ours].detach().to("cpu")
        out[theirs] = (tensor.t() if transform is _transposed else tensor).contiguous().clone()
    return out
