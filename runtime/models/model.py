"""The models: a small GPT (nanoGPT-sized) and a tiny MLP, both as a flat list of layers.

A model is a list of layers (input layer, blocks, head) so the partitioner can cut it anywhere.
Layer `l` is initialised from its own seed, so any node can build any layer bit-identically
without receiving it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.config import USER_MODEL_KIND, ModelSpec


class Embed(nn.Module):
    """Token + position embedding: (B, T) int64 -> (B, T, C)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.n_embd)
        self.wpe = nn.Embedding(spec.seq_len, spec.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(pos)  # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention: (B, T, C) -> (B, T, C)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.n_head = spec.n_head
        self.ln_1 = nn.LayerNorm(spec.n_embd)  # eps 1e-5, as GPT-2
        # GPT-2's layout: one (q, k, v) projection with a bias (so GPT-2 weights load exactly).
        self.c_attn = nn.Linear(spec.n_embd, 3 * spec.n_embd)
        self.c_proj = nn.Linear(spec.n_embd, spec.n_embd)
        self.ln_2 = nn.LayerNorm(spec.n_embd)
        self.mlp_fc = nn.Linear(spec.n_embd, 4 * spec.n_embd)
        self.mlp_proj = nn.Linear(4 * spec.n_embd, spec.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = F.linear(self.ln_1(x), self.c_attn.weight, self._qkv_bias(C)).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scaled by 1/sqrt(head size), as GPT-2
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x)), approximate="tanh"))  # GPT-2's GELU

    def _qkv_bias(self, C: int) -> torch.Tensor:
        """c_attn's bias with its key part detached: the key bias adds q.b_k to every score of a row,
        which softmax ignores, so its true gradient is zero; Adam would turn the float noise of that
        zero into large updates that differ between summation orders. Detached, its gradient is
        exactly zero and it never moves (it still takes part in the forward, as in GPT-2)."""
        b = self.c_attn.bias
        return torch.cat([b[:C], b[C : 2 * C].detach(), b[2 * C :]])


class Head(nn.Module):
    """Final norm + LM head: (B, T, C) -> (B, T, vocab)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(spec.n_embd)
        self.lm_head = nn.Linear(spec.n_embd, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class Dense(nn.Module):
    """Linear + tanh, the MLP's layer: (B, in) -> (B, out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def build_layer(spec: ModelSpec, index: int, seed: int) -> nn.Module:
    """Build layer `index` of the model, initialised from (seed, index) only (a user's model: see
    `runtime.models.usermodel` for its rule)."""
    if spec.kind == USER_MODEL_KIND:
        from runtime.models.usermodel import build_user_layer

        return build_user_layer(spec, index, seed)
    if not 0 <= index < spec.num_layers:
        raise IndexError(f"layer {index} out of range; the model has {spec.num_layers} layers")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed * 100_003 + index)
    try:
        last = index == spec.num_layers - 1
        if spec.kind == "gpt":
            return Embed(spec) if index == 0 else Head(spec) if last else Block(spec)
        if index == 0:
            return Dense(spec.in_features, spec.n_embd)
        return nn.Linear(spec.n_embd, spec.vocab_size) if last else Dense(spec.n_embd, spec.n_embd)
    finally:
        torch.random.set_rng_state(gen_state)


def build_model(spec: ModelSpec, seed: int) -> nn.Sequential:
    """The whole model in one process (the single-process reference)."""
    return nn.Sequential(*(build_layer(spec, i, seed) for i in range(spec.num_layers)))


def activation_shape(spec: ModelSpec, batch: int) -> tuple[int, ...]:
    """Shape of the tensor passed between any two layers of a built-in model. The executor uses the
    per-boundary shapes of `runtime.models.usermodel.boundary_shapes` (any model)."""
    return (batch, spec.seq_len, spec.n_embd) if spec.kind == "gpt" else (batch, spec.n_embd)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of one micro-batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
