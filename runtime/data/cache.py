"""The node cache of tokenized corpora: text-like sources (text, jsonl, hf, wds, mds) are tokenized once per
node into token files (the `tokens:` format) and every later open, by any rank or run, memory-maps
them.

Where: `<cache_root()>/tokens/<key>/`, holding `<stream>.bin` per stream ("all", or "train" and
"val" when the source has its own validation split) and `meta.json`.
Keyed by: sha256 of the source files' contents (in stream order), the tokenizer's identity, the
format and its options, and `CACHE_VERSION`; not by paths (a moved corpus is reused) and not by
`val_fraction` (the tail is held out when the cache is opened, not when it is written).
Shared: an exclusive `flock` on `<key>.lock` lets one process per node tokenize while the others
wait, then they read its files.
Atomic: each stream is written to a temporary file in the entry's folder and `os.replace`d in;
`meta.json` (token counts, max id, source, tokenizer, key) is written last, the same way. An entry
without a meta.json whose sizes match it is never trusted: the next open deletes and rebuilds it.
A tokenization that fails (an error) deletes its entry before the error goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.data.errors import DataError
from runtime.data.s3 import exclusive

CACHE_VERSION = 1
"""Bump when the tokenization rule (separator, chunking, dtype) changes: old entries stop matching."""
FLUSH_TOKENS = 1 << 20
"""Tokens buffered before a write: memory stays bounded whatever the corpus size."""

Documents = Iterable[Iterable[str]]
"""Documents in order, each given as text pieces (a large file read chunk by chunk is one document)."""


def token_dtype(vocab_size: int) -> str:
    """uint16 while every id fits (vocabularies up to 65,536), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def content_key(*, fmt: str, options: dict[str, str], tokenizer: str, digests: dict[str, list[str]]) -> str:
    """The content hash of a token stream: its source files' digests (per stream, in order), the
    format and options, the tokenizer's identity and the tokenization rule's version. A prepared
    corpus (`runtime.data.prepared`) records the same key as the node cache's entry of its source."""
    blob = json.dumps({"version": CACHE_VERSION, "format": fmt, "options": options, "tokenizer": tokenizer,
                       "content": digests}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def cache_key(*, fmt: str, options: dict[str, str], tokenizer: str, streams: dict[str, list[Path]]) -> str:
    """The content hash an entry is stored under (see the module docstring)."""
    digests = {name: [file_digest(p) for p in files] for name, files in streams.items()}
    return content_key(fmt=fmt, options=options, tokenizer=tokenizer, digests=digests)


@dataclass(frozen=True, slots=True)
class CachedTokens:
    folder: Path
    meta: dict[str, Any]

    def stream(self, name: str) -> np.ndarray | None:
        """The stream's tokens as a read-only memmap (None when the entry has no such stream)."""
        count = self.meta["tokens"].get(name)
        if count is None:
            return None
        if count == 0:  # numpy cannot map an empty file
            return np.zeros(0, dtype=self.meta["dtype"])
        return np.memmap(self.folder / f"{name}.bin", dtype=self.meta["dtype"], mode="r")


def _trusted(folder: Path) -> CachedTokens | None:
    """The entry, if its meta.json exists and every stream file has the size it records."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        width = np.dtype(meta["dtype"]).itemsize
        for name, count in meta["tokens"].items():
            if (folder / f"{name}.bin").stat().st_size != count * width:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CachedTokens(folder, meta)


def _write_stream(path: Path, documents: Documents, encode: Callable[[str], np.ndarray],
                  separator: np.ndarray, dtype: str) -> tuple[int, int]:
    """Tokenize `documents` into `path` (temporary file, then `os.replace`); (tokens, max id)."""
    temporary = path.with_name(f".{path.name}.part-{os.getpid()}")
    count, top, buffered, pending = 0, -1, 0, []
    try:
        with open(temporary, "wb") as handle:
            for number, document in enumerate(documents):
                parts = [separator] if number else []
                parts.extend(encode(piece) for piece in document)
                for ids in parts:
                    if len(ids):
                        top = max(top, int(ids.max()))
                        pending.append(ids)
                        buffered += len(ids)
                if buffered >= FLUSH_TOKENS:
                    np.concatenate(pending).astype(dtype).tofile(handle)
                    count, buffered, pending = count + buffered, 0, []
            if pending:
                np.concatenate(pending).astype(dtype).tofile(handle)
                count += buffered
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return count, top


def tokenized(key: str, streams: dict[str, Callable[[], Documents]], tokenizer: Any, cache_dir: Path,
              describe: dict[str, Any]) -> CachedTokens:
    """The cache entry `key`, tokenizing `streams` (stream name -> its documents) if no trusted entry
    exists; one process per node tokenizes, the others wait for it."""
    from runtime.data.hygiene import touch

    base = cache_dir / "tokens"
    folder = base / key
    if (found := _trusted(folder)) is not None:
        touch(folder)
        return found
    with exclusive(base / f"{key}.lock"):
        if (found := _trusted(folder)) is not None:  # another rank built it while this one waited
            touch(folder)
            return found
        shutil.rmtree(folder, ignore_errors=True)  # a killed tokenizer's leftovers
        folder.mkdir(parents=True)
        dtype = token_dtype(tokenizer.vocab_size)
        try:
            counts, top = {}, -1
            for name, documents in streams.items():
                counts[name], stream_top = _write_stream(folder / f"{name}.bin", documents(), tokenizer.encode,
                                                         tokenizer.separator, dtype)
                top = max(top, stream_top)
            if top >= tokenizer.vocab_size:
                raise DataError(f"{describe.get('source')}: tokenizer {describe.get('tokenizer')!r} produced id "
                                f"{top}, beyond its own vocabulary of {tokenizer.vocab_size}")
            meta = {**describe, "key": key, "dtype": dtype, "tokens": counts, "max_id": top,
                    "tokenizer_identity": tokenizer.identity, "version": CACHE_VERSION}
            temporary = folder / f".meta.json.part-{os.getpid()}"
            temporary.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(temporary, folder / "meta.json")
            touch(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    return CachedTokens(folder, meta)


def open_tokenized(uri: Any, spec: Any, model: Any, cache_dir: Path, *, files: dict[str, list[Path]],
                   documents: Callable[[list[Path]], Documents]) -> Any:
    """The `Dataset` of a text-like source: its streams' files (`all`, or `train` and `val`)
    tokenized through the node cache, windows of seq_len + 1 tokens; without a `val` stream the
    tail `val_fraction` of the tokens is held out (`tokens.hold_out_tail`)."""
    from runtime.data.formats.tokens import hold_out_tail, windows_dataset
    from runtime.data.tokenizer import check_model_vocabulary, load_tokenizer

    tokenizer = load_tokenizer(spec.tokenizer, cache_dir)
    check_model_vocabulary(tokenizer, model, spec.tokenizer)
    key = cache_key(fmt=uri.format, options=uri.options, tokenizer=tokenizer.identity, streams=files)
    describe = {"source": str(uri), "format": uri.format, "tokenizer": spec.tokenizer,
                "files": {name: len(paths) for name, paths in files.items()}}
    entry = tokenized(key, {name: (lambda paths=paths: documents(paths)) for name, paths in files.items()},
                      tokenizer, cache_dir, describe)
    if entry.meta["max_id"] >= model.vocab_size:  # an entry made with a tokenizer of the same identity
        raise DataError(f"{uri} holds token id {entry.meta['max_id']}, beyond the model's vocabulary "
                        f"(model.vocab_size={model.vocab_size})")
    if "val" in files:
        train, val = entry.stream("train"), entry.stream("val")
    else:
        train, val = hold_out_tail(entry.stream("all"), spec, model, f"{uri} (tokenized)")
    description = {**describe, "content_hash": key, "cache": str(entry.folder), "tokens_dtype": entry.meta["dtype"]}
    return windows_dataset(train, val, model, description)
