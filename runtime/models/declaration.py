"""What a model function may declare beside its layers (no torch here: `spotpipe.Model` imports nothing).

    def my_model(width=64, context=128):
        layers = [...]
        return spotpipe.Model(layers, seq_len=context, vocab_size=256)

`seq_len` is the context the data's token windows get, `vocab_size` the ids its embedding takes (at
least the tokenizer's), `language_model` whether its output is logits over the vocabulary at each
position (default: it is when it has a vocabulary). A value also set in the job (`--seq-len`,
`[config.model] seq_len`) must be the same, or the job is refused naming both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DECLARED_FIELDS = ("seq_len", "vocab_size", "language_model")


@dataclass(frozen=True, slots=True)
class Model:
    """A model function's layers (any form `runtime.models.usermodel` takes) and what the data need."""

    layers: Any
    seq_len: int | None = None
    vocab_size: int | None = None
    language_model: bool | None = None

    def declared(self) -> dict[str, Any]:
        """The fields it declares (not None)."""
        return {name: getattr(self, name) for name in DECLARED_FIELDS if getattr(self, name) is not None}
