"""Sample text from a trained GPT (`spotpipe.load_model` loads one from its weights folder)."""

from __future__ import annotations

import torch
from torch import nn

from runtime.config import ModelSpec


@torch.no_grad()
def sample(model: nn.Sequential, spec: ModelSpec, prompt: list[int], new_tokens: int, *,
           temperature: float = 0.8, seed: int = 0) -> list[int]:
    """`new_tokens` ids drawn one by one after `prompt` (the last `seq_len` ids as context)."""
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(new_tokens):
        context = torch.tensor([ids[-spec.seq_len:]], dtype=torch.int64)
        logits = model(context)[0, -1] / temperature
        ids.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)))
    return ids[len(prompt):]
