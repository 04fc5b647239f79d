"""`jsonl:` JSON Lines (`?field=NAME`, default `text`): one file, a folder, a glob or an S3
object/prefix (files as for `text:`, `runtime.data.files`). Each non-blank line is a JSON object
whose `field` is a string: one document. Documents are joined with the tokenizer's separator,
tokenized once per node into the node cache; the validation split is the tail `val_fraction` of
the tokens. A line that is not JSON, not an object, or without a string `field` is a `DataError`
naming file:line and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.cache import Documents, open_tokenized
from runtime.data.errors import DataError
from runtime.data.files import source_files

if TYPE_CHECKING:  # torch: not imported by `spotpipe data prepare`'s workers
    from runtime.data.dataset import Dataset


def read_field(path: Path, field: str) -> Iterator[str]:
    """The `field` strings of a JSON Lines file, line by line."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(raw)
            except UnicodeDecodeError as exc:
                raise DataError(f"{where} is not UTF-8 ({exc.reason}); expected a JSON object per line") from None
            except ValueError as exc:
                raise DataError(f"{where} is not JSON ({exc}); expected a JSON object with a string "
                                f"field {field!r} per line") from None
            if not isinstance(record, dict) or field not in record:
                got = "an object without it" if isinstance(record, dict) else f"a JSON {type(record).__name__}"
                raise DataError(f"{where} has no field {field!r} (got {got}); expected a JSON object with a "
                                f"string field {field!r} (set it with ?field=NAME)")
            if not isinstance(record[field], str):
                raise DataError(f"{where}: field {field!r} is a {type(record[field]).__name__}, expected a string")
            yield record[field]


def documents_of(uri: SourceURI, paths: list[Path]) -> Documents:
    """The documents of `paths` in order: each line's `field` string."""
    return ([text] for path in paths for text in read_field(path, uri.options["field"]))


def stream_files(uri: SourceURI, cache_dir: Path) -> dict[str, list[Path]]:
    return {"all": source_files(uri, cache_dir)}


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    return open_tokenized(uri, spec, model, cache_dir, files=stream_files(uri, cache_dir),
                          documents=lambda paths: documents_of(uri, paths))
