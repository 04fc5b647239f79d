"""`text:` UTF-8 text: one file, a folder (every regular non-hidden file under it, recursively,
sorted by path: see `runtime.data.files`), a glob, or an S3 object/prefix.

Each file is one document; documents are joined with the tokenizer's separator (end-of-text, or
"\\n\\n": `runtime.data.tokenizer`). A file is read in pieces of about `CHUNK_BYTES` and each piece is
encoded on its own, so a corpus of any size is never held in memory whole.
Pieces are cut at line starts (after a newline, before a non-space), where GPT-2-style and
whitespace pre-tokenizers split anyway, so the ids are those of the whole file (for the byte
tokenizer always exactly the file's bytes); a tokenizer that merges across lines may differ there,
deterministically, on every node alike. Tokenized once per node into the
node cache; the validation split is the tail `val_fraction` of the tokens.
A file that is not UTF-8 (a binary file in the folder) is a `DataError` naming it and the byte
offset: select the text files with a glob instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.cache import Documents, open_tokenized
from runtime.data.errors import DataError
from runtime.data.files import source_files

if TYPE_CHECKING:  # torch: not imported by `spotpipe data prepare`'s workers
    from runtime.data.dataset import Dataset

CHUNK_BYTES = 1 << 20
MAX_PIECE_BYTES = 1 << 26
"""A file with no line start for this long (64 MiB) is cut at a character boundary instead."""


def _char_start(data: bytes, cut: int) -> int:
    """Move `cut` back to the start of a UTF-8 character (at most 3 continuation bytes)."""
    back = cut
    while back > max(0, cut - 3) and (data[back] & 0xC0) == 0x80:
        back -= 1
    return back


def _line_cut(data: bytes) -> int:
    """The last position just after a newline and before a non-space byte (0: none). Tokenizers
    whose pre-tokenizer splits there (GPT-2's byte-level BPE, whitespace word models, bytes) give
    the same ids for the two pieces as for the whole text."""
    newline = data.rfind(b"\n", 0, len(data) - 1)
    while newline >= 0 and data[newline + 1] in _SPACES:
        newline = data.rfind(b"\n", 0, newline)
    return newline + 1


_SPACES = frozenset(b" \t\r\n\f\v")


def read_text(path: Path, chunk_bytes: int = CHUNK_BYTES, max_carry: int = MAX_PIECE_BYTES) -> Iterator[str]:
    """The file's text in pieces of about `chunk_bytes` cut at line starts (`_line_cut`), or after
    `max_carry` bytes without one at a character boundary; `DataError` with the byte offset of the
    first byte that is not UTF-8."""
    offset, carry = 0, b""
    with open(path, "rb") as handle:
        while True:
            block = handle.read(chunk_bytes)
            data = carry + block
            if not data:
                return
            if not block:  # the end of the file: everything
                cut = len(data)
            else:
                cut = _line_cut(data)
                if not cut and len(data) > max_carry:
                    cut = _char_start(data, len(data) - 1)
            piece, carry = data[:cut], data[cut:]
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path} is not UTF-8 text: byte offset {offset + exc.start} "
                                f"({piece[exc.start:exc.start + 1]!r}: {exc.reason}); expected UTF-8 text files "
                                "(select them with a glob when the folder holds other files)") from None
            offset += len(piece)
            if text:
                yield text


def documents_of(uri: SourceURI, paths: list[Path]) -> Documents:
    """The documents of `paths` in order: each file one, read in pieces."""
    return (read_text(path) for path in paths)


def stream_files(uri: SourceURI, cache_dir: Path) -> dict[str, list[Path]]:
    return {"all": source_files(uri, cache_dir)}


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    return open_tokenized(uri, spec, model, cache_dir, files=stream_files(uri, cache_dir),
                          documents=lambda paths: documents_of(uri, paths))
