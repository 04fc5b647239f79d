"""Tokenizers of text-like sources (text, jsonl, hf, wds, mds): the built-in byte-level one and a Hugging Face
`tokenizer.json`, behind one small interface.

`identity` names what the token ids depend on, so the node cache (`runtime.data.cache`) keys a
tokenized corpus by it: "byte", or "sha256:<hex>" of the tokenizer.json's bytes (a tokenizer edited
in place gets a new cache entry; the same file under another path reuses the old one).

Documents are joined with `separator`: the tokenizer's end-of-text token when it has one of the
usual names (`END_OF_TEXT`), else the tokens of "\\n\\n" (the byte tokenizer: ids 10, 10).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np

from runtime.config import BYTE_VOCAB_SIZE, ModelSpec
from runtime.data.errors import DataError

DOCUMENT_SEPARATOR = "\n\n"
"""Joins documents when the tokenizer has no end-of-text token."""
END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""Special tokens taken as end-of-text, first found wins (GPT-2, Llama/T5, Gemma, Llama 3)."""


class Tokenizer(Protocol):
    vocab_size: int
    """Ids are below this."""
    identity: str
    """Stable across nodes and runs: "byte" or "sha256:<hex of tokenizer.json>"."""
    separator: np.ndarray
    """Token ids put between two documents."""

    def encode(self, text: str) -> np.ndarray:
        """The ids of `text` (int64), no special tokens added."""
        ...

    def decode(self, ids: list[int] | np.ndarray) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255: no file, no training, any text."""

    vocab_size = BYTE_VOCAB_SIZE
    identity = "byte"

    def __init__(self) -> None:
        self.separator = self.encode(DOCUMENT_SEPARATOR)

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: list[int] | np.ndarray) -> str:
        # A sampled sequence may cut a character in two: show it as U+FFFD rather than fail.
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what a byte-level tokenizer.json spells bytes with)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer_json() -> str:
    """`ByteTokenizer` as a Hugging Face tokenizer.json: byte-level, no merges, id = the byte's value,
    so `transformers` encodes and decodes any text exactly as spotpipe's byte tokenizer does."""
    from tokenizers import Tokenizer as _Tokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    tok = _Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json (BPE, WordPiece, Unigram...)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DataError(f"tokenizer {path} cannot be read ({exc.strerror}); expected a tokenizer.json") from None
        try:
            self._tok = _Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise DataError(f"tokenizer {path} is not a Hugging Face tokenizer.json ({exc})") from None
        self.path = path
        self.identity = "sha256:" + hashlib.sha256(raw).hexdigest()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        eot = next((t for t in END_OF_TEXT if self._tok.token_to_id(t) is not None), None)
        self.separator = (np.array([self._tok.token_to_id(eot)], dtype=np.int64) if eot is not None
                          else self.encode(DOCUMENT_SEPARATOR))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids: list[int] | np.ndarray) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(spec_value: str, cache_dir: Path) -> Tokenizer:
    """`byte`, or a tokenizer.json by path or s3:// URI (fetched into the node cache first)."""
    if spec_value == "byte":
        return ByteTokenizer()
    if spec_value.startswith("s3://"):
        from runtime.data.s3 import fetch

        return HFTokenizer(fetch(spec_value, cache_dir).path)
    path = Path(spec_value)
    if not path.is_file():
        raise DataError(f"data.tokenizer {spec_value!r} does not exist on this node; expected 'byte' "
                        "or the path of a Hugging Face tokenizer.json")
    return HFTokenizer(path)


def check_model_vocabulary(tokenizer: Tokenizer, model: ModelSpec, tokenizer_name: str) -> None:
    """`DataError` when the tokenizer makes ids the model has no embedding for."""
    if tokenizer.vocab_size > model.vocab_size:
        raise DataError(f"tokenizer {tokenizer_name!r} has {tokenizer.vocab_size} ids, more than the model's "
                        f"vocabulary (model.vocab_size={model.vocab_size}); expected model.vocab_size >= "
                        f"{tokenizer.vocab_size}")
