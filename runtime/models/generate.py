"""Sample text from a trained language model (`spotpipe.load_model` loads one from its weights folder):
the built-in GPT, or a user's model declared a language model (logits over its vocabulary on the last
dimension, one position per input token)."""

from __future__ import annotations

import torch
from torch import nn

from runtime.config import ModelSpec


@torch.no_grad()
def sample(model: nn.Sequential, spec: ModelSpec, prompt: list[int], new_tokens: int, *,
           temperature: float = 0.8, seed: int = 0, top_k: int | None = None) -> list[int]:
    """`new_tokens` ids drawn one by one after `prompt` (the last `seq_len` ids as context), from the
    `top_k` most likely ids when given. Raises `ValueError` when the model's output is not logits
    over `spec.vocab_size` ids per position."""
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(new_tokens):
        context = torch.tensor([ids[-spec.seq_len:]], dtype=torch.int64)
        output = model(context)
        if output.dim() != 3 or output.shape[:2] != context.shape or output.shape[-1] != spec.vocab_size:
            raise ValueError(f"the model's output for a (1, {context.shape[1]}) batch of token ids has shape "
                             f"{tuple(output.shape)}; expected logits (1, {context.shape[1]}, {spec.vocab_size}): "
                             "a language model over model.vocab_size ids")
        logits = output[0, -1] / temperature
        if top_k is not None and top_k < logits.numel():
            kth = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        ids.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)))
    return ids[len(prompt):]
