"""User models unlike the built-in GPT, their data (`py:` map-style datasets) and a custom loss, plus
broken models, one per validation failure. Imported by the ranks by path: `tests.usermodels.models:...`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# -- a small CNN classifier on synthetic images, returned whole (an nn.Sequential) -----------------


def cnn(channels: int = 4, classes: int = 3) -> nn.Sequential:
    """(B, 1, 8, 8) images -> conv -> conv (stride 2) -> flatten + linear -> logits: the boundaries
    change shape, (B, C, 8, 8) -> (B, 2C, 4, 4) -> (B, 16)."""
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.ReLU()),
        nn.Sequential(nn.Flatten(), nn.Linear(2 * channels * 16, 16), nn.Tanh()),
        nn.Linear(16, classes),
    )


class Images(torch.utils.data.Dataset):
    """Synthetic 8x8 images whose class is the quadrant holding a bright blob (learnable)."""

    def __init__(self, count: int = 96, classes: int = 3) -> None:
        gen = torch.Generator().manual_seed(7)
        self.labels = torch.randint(0, classes, (count,), generator=gen)
        self.images = 0.1 * torch.randn(count, 1, 8, 8, generator=gen)
        for i, label in enumerate(self.labels.tolist()):
            r, c = divmod(label, 2)
            self.images[i, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] += 1.0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def images() -> Images:
    return Images()


# -- a residual MLP with LayerNorm, as layer factories, with a custom loss (regression) -------------


class Residual(nn.Module):
    """x + W2 gelu(W1 LayerNorm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def resmlp(features: int = 6, width: int = 16, blocks: int = 2, outputs: int = 2) -> list:
    """Layer factories: each rank builds only the layers it holds (seeded per layer index)."""
    return [
        lambda: nn.Linear(features, width),
        *[(lambda: Residual(width)) for _ in range(blocks)],
        lambda: nn.Sequential(nn.LayerNorm(width), nn.Linear(width, outputs)),
    ]


def huber(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The custom loss: mean Huber loss."""
    return F.smooth_l1_loss(output, target)


def regression(split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """y = A x + noise, 6 features -> 2 outputs; separate train and val draws."""
    gen = torch.Generator().manual_seed(11 if split == "train" else 12)
    weights = torch.randn(6, 2, generator=torch.Generator().manual_seed(3))
    x = torch.randn(80 if split == "train" else 16, 6, generator=gen)
    y = x @ weights + 0.05 * torch.randn(len(x), 2, generator=gen)
    return list(zip(x, y, strict=True))


# -- a causal token model holding what its weights do not (a non-persistent mask) -------------------


class CausalMix(nn.Module):
    """Causal token mixing: a learned (T, T) mixing masked by a causal mask registered with
    `persistent=False` (as nanoGPT and Hugging Face register theirs: not in the state dict), and two
    projections tied to one weight."""

    def __init__(self, width: int, context: int) -> None:
        super().__init__()
        self.mixing = nn.Parameter(0.1 * torch.randn(context, context))
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)), persistent=False)
        self.up = nn.Linear(width, width, bias=False)
        self.down = nn.Linear(width, width, bias=False)
        self.down.weight = self.up.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        weights = self.mixing[:t, :t].masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return x + self.down(torch.tanh(self.up(weights @ x)))


def causal_lm(vocab: int = 16, width: int = 8, context: int = 8) -> list:
    return [lambda: nn.Embedding(vocab, width), lambda: CausalMix(width, context), lambda: nn.Linear(width, vocab)]


def byte_lm(context: int = 32, width: int = 16) -> object:
    """A byte-level language model that declares what its data need: its context and vocabulary."""
    import spotpipe

    layers = [lambda: nn.Embedding(256, width), lambda: CausalMix(width, context), lambda: nn.Linear(width, 256)]
    return spotpipe.Model(layers, seq_len=context, vocab_size=256)


def lm_said_not(context: int = 8) -> object:
    """The same shape of model, declared not a language model (say, a per-token tagger)."""
    import spotpipe

    layers = [lambda: nn.Embedding(256, 8), lambda: CausalMix(8, context), lambda: nn.Linear(8, 256)]
    return spotpipe.Model(layers, seq_len=context, vocab_size=256, language_model=False)


def counting(split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Windows of 8 tokens counting up modulo 16 from a random start: next-token pairs."""
    gen = torch.Generator().manual_seed(21 if split == "train" else 22)
    starts = torch.randint(0, 16, (64 if split == "train" else 8,), generator=gen)
    windows = [(start + torch.arange(9)) % 16 for start in starts]
    return [(w[:-1], w[1:]) for w in windows]


# -- broken models, one per validation failure ------------------------------------------------------


def returns_dict() -> dict:
    return {"a": nn.Linear(2, 2)}


def mixed() -> list:
    return [nn.Linear(2, 2), "not a layer"]


def two_layers() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 2))


def mismatched() -> nn.Sequential:
    """Layer 2 expects 32 features, layer 1 gives 16."""
    return nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(32, 2))


def parameterless() -> nn.Sequential:
    """Layers without parameters inside and at both ends: each joins a neighbour's stage."""
    return nn.Sequential(nn.Identity(), nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2),
                         nn.Identity())


def no_parameters() -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Tanh())


_calls = [0]


def nondeterministic() -> list:
    """Draws its initialisation from a fresh generator seeded differently on every call."""
    _calls[0] += 1
    gen = torch.Generator().manual_seed(1000 + _calls[0])

    def noisy() -> nn.Module:
        layer = nn.Linear(6, 16)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(16, 6, generator=gen))
        return layer

    return [noisy, lambda: nn.Linear(16, 16), lambda: nn.Linear(16, 2)]


def bad_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output  # not a scalar


_LOSS_CALLS = [0]
CRASH_AFTER_CALLS = 8


def crashing_huber(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss whose code breaks a few steps into training, in every process that runs it (its own
    count: a restarted worker validates, trains a few steps and breaks again): a user error."""
    _LOSS_CALLS[0] += 1
    if _LOSS_CALLS[0] > CRASH_AFTER_CALLS:
        raise ValueError(f"bad batch: loss call {_LOSS_CALLS[0]} cannot be computed")
    return F.smooth_l1_loss(output, target)


def narrow_lm(context: int = 16) -> object:
    """Declares a byte vocabulary but its last layer gives 10 logits: cross-entropy on byte ids would
    index past them on every rank."""
    import spotpipe

    layers = [lambda: nn.Embedding(256, 32), lambda: nn.Linear(32, 32), lambda: nn.Linear(32, 10)]
    return spotpipe.Model(layers, seq_len=context, vocab_size=256)
